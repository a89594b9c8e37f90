//! Hostile inputs (tests/fixtures/hostile, see its README): each gets a clear message, its exit
//! code, and bounded time and output. Each test names the fault it pins.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile").join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Runs alloctrace; returns its output and how long it took.
fn run(args: &[&str]) -> (Output, Duration) {
    run_env(args, &[])
}

/// Like [`run`], with environment variables set.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let start = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run alloctrace");
    (o, start.elapsed())
}

/// Reads past the bound on events per byte of a file, for the tests that pin what the engine,
/// the analyses and the outputs cost on a whole compressible input (by default it is cut at 4
/// events per byte and a chunk: `compressible_events_past_4_per_byte_are_cut_as_damage`).
const UNCAPPED: &[(&str, &str)] = &[("ALLOCTRACE_MAX_EVENTS_PER_BYTE", "0")];

/// [`expect`] on the whole input ([`UNCAPPED`]).
fn expect_uncapped(args: &[&str], code: i32, needle: &str, secs: u64) -> Output {
    let (o, took) = run_env(args, UNCAPPED);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in: {err}");
    assert!(took < Duration::from_secs(secs), "{args:?} took {took:?}");
    o
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit code `code`, `needle` on stderr, within `secs` (a debug build on a slow machine).
fn expect(args: &[&str], code: i32, needle: &str, secs: u64) -> Output {
    let (o, took) = run(args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in: {err}");
    assert!(took < Duration::from_secs(secs), "{args:?} took {took:?}");
    o
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// No raw control character (but newline and tab) anywhere in `s`.
fn assert_no_controls(s: &str, what: &str) {
    let bad: Vec<char> = s.chars().filter(|&c| c.is_control() && c != '\n' && c != '\t').collect();
    assert!(bad.is_empty(), "{what} holds control characters {bad:?}");
}

#[test]
fn decompression_bomb_of_256m_events_is_corrupt_at_once() {
    // Was: exit 0 after 26 s and 6.5 GB resident.
    let f = fixture("snap256M.atrace");
    for cmd in ["summary", "dump", "leaks"] {
        expect(
            &[cmd, path(&f)],
            3,
            "corrupt at byte 205: chunk claims 89478485 events; a writer puts at most 65536 in a chunk; analyzed the 0 events before the damage",
            10,
        );
    }
}

#[test]
fn call_site_of_250m_frames_is_corrupt_at_once() {
    // Was: 15 s and 5 GB.
    let f = fixture("cs250M.atrace");
    expect(
        &["summary", path(&f)],
        3,
        "corrupt at byte 205: chunk body of 262144007 bytes exceeds the limit of 33554432 (a writer ends a chunk at 8388608)",
        10,
    );
}

#[test]
fn large_segment_size_zero_in_a_header_is_refused_not_a_panic() {
    // Was: a divide by zero (exit 101) in replay, whatif, explain and report.
    let f = fixture("lss0_exp_s0.atrace");
    let out = tmp("lss0-report");
    for args in [
        vec!["replay", path(&f)],
        vec!["whatif", path(&f)],
        vec!["explain", path(&f)],
        vec!["summary", path(&f)],
        vec!["report", path(&f), "-o", path(&out)],
    ] {
        let o = expect(
            &args,
            2,
            "corrupt trace at byte 12: header field `config` holds allocator settings that are refused: large_segment_size_mb must be > 10 (got 0)",
            10,
        );
        assert_eq!(text(&o.stderr).lines().count(), 1, "{}", text(&o.stderr));
    }
}

/// The text of a Markdown line outside its code spans (whose content is literal): what a
/// Markdown renderer interprets. A run of N backticks opens a span that the next run of exactly
/// N closes (CommonMark). Backslash-escaped characters are dropped with their backslash.
fn markdown_outside_code(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let (mut out, mut i) = (String::new(), 0);
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '`' => {
                let n = run_at(i);
                let mut j = i + n;
                let close = loop {
                    match chars[j.min(chars.len())..].iter().position(|&c| c == '`') {
                        None => break None,
                        Some(k) if run_at(j + k) == n => break Some(j + k),
                        Some(k) => j += k + run_at(j + k),
                    }
                };
                i = close.map_or(i + n, |c| c + n);
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// What a report of a hostile trace wrote: no markup, link, heading or control character of
/// the trace's is live in it.
fn assert_report_is_inert(dir: &Path) {
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_no_controls(&md, "report.md");
    assert_no_controls(&html, "report.html");
    for bad in ["<script", "<img"] {
        assert!(!html.contains(bad), "report.html holds a live {bad}");
    }
    for line in md.lines() {
        // The report's own pictures, `[![TITLE](NAME.png)](NAME.svg)`: only the title comes from
        // the trace, and it is checked like any text.
        let names = ["timeline", "timeline-callsites", "segments", "whatif", "frag", "categories"];
        let own = names.iter().find_map(|n| line.strip_prefix("[![")?.strip_suffix(&format!("]({n}.png)]({n}.svg)")));
        let line = own.unwrap_or(line);
        let live = markdown_outside_code(line);
        for bad in ["<script", "<img", "](", "<http"] {
            assert!(!live.contains(bad), "report.md: a live {bad} in: {line}");
        }
        assert!(!line.starts_with("# INJECTED") && !line.starts_with("# CONF"), "a heading broke out: {line}");
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "svg") {
            let svg = std::fs::read_to_string(&p).unwrap();
            // Control characters are not allowed in XML 1.0, even as entities.
            assert_no_controls(&svg, &p.display().to_string());
            assert!(!svg.contains("<script") && !svg.contains("<img"), "{}", p.display());
        }
    }
}

#[test]
fn header_and_call_site_payloads_stay_text_in_reports_and_on_the_terminal() {
    // Was: raw in report.md (a backtick closed the code span, a newline broke the table) and
    // raw ANSI escapes on the terminal.
    let f = fixture("hdr_xss.atrace");
    let dir = tmp("hdr-report");
    let (o, _) = run(&["report", path(&f), "-o", path(&dir)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_report_is_inert(&dir);
    for cmd in ["dump", "summary", "explain", "leaks", "replay"] {
        let (o, _) = run(&[cmd, path(&f)]);
        assert!(o.status.code() == Some(0), "{cmd}: {}", text(&o.stderr));
        let out = text(&o.stdout);
        assert_no_controls(&out, cmd);
        assert_no_controls(&text(&o.stderr), cmd);
        assert!(!out.lines().any(|l| l.starts_with("# INJECTED")), "{cmd} printed a forged line:\n{out}");
    }
    let (o, _) = run(&["summary", "--json", path(&f)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json stays valid JSON");
    assert!(v.is_object());
    // The picture's title (the device's name) and mark labels show the newlines escaped: no
    // forged line inside the SVG's text.
    let svg = tmp("hdr-timeline.svg");
    let (o, _) = run(&["plot", path(&f), "-o", path(&svg)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains(r"a\n\n# INJECTED HEADING"), "the device's name, escaped, is in the title");
    assert!(!svg.contains("\n# INJECTED"), "a raw newline of the trace's in the picture");
}

#[test]
fn snapshot_payloads_stay_text_after_import() {
    let f = fixture("xss.pickle");
    let t = tmp("xss.atrace");
    let (o, _) = run(&["import", "torch", path(&f), "-o", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert_no_controls(&out, "import warnings");
    assert!(out.contains("frame file or function names are longer than 4096 bytes; cut with a marker"), "{out}");
    let dir = tmp("xss-report");
    let (o, _) = run(&["report", path(&t), "-o", path(&dir)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_report_is_inert(&dir);
    let (o, _) = run(&["dump", path(&t)]);
    assert_no_controls(&text(&o.stdout), "dump");
    // Read as a snapshot, each command's warnings (its settings string holds an escape
    // sequence) reach the terminal escaped.
    for cmd in ["summary", "dump", "replay", "whatif", "explain", "frag", "leaks"] {
        let (o, _) = run(&[cmd, path(&f)]);
        assert!(o.status.code().is_some_and(|c| c <= 3), "{cmd}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains("invalid allocator configuration"), "{cmd}: {err}");
        assert_no_controls(&err, cmd);
        assert_no_controls(&text(&o.stdout), cmd);
    }
}

#[test]
fn memo_keys_far_past_the_memo_take_no_memory() {
    // Was: 1.5 GB resident. The pickle is not a snapshot once parsed.
    let f = fixture("memo_bomb_1k.pickle");
    expect(
        &["import", "torch", path(&f), "-o", path(&tmp("memo.atrace"))],
        2,
        "not a PyTorch memory snapshot: top-level object is a None",
        10,
    );
}

#[test]
fn a_huge_frame_referenced_300_times_imports_into_a_readable_trace() {
    // Was: exit 0 writing a trace whose own reader called it corrupt at byte 70.
    let f = fixture("laughs_frames_300.pickle");
    let t = tmp("laughs.atrace");
    let (o, took) = run(&["import", "torch", path(&f), "-o", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(text(&o.stdout).contains("longer than 4096 bytes; cut with a marker"), "{}", text(&o.stdout));
    assert!(std::fs::metadata(&t).unwrap().len() < 64 << 10, "the 1 MiB name is not stored 300 times");
    let (o, _) = run(&["dump", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "the imported trace reads whole: {}", text(&o.stderr));
    assert!(text(&o.stdout).contains("...[truncated: 1048576 bytes]"), "{}", text(&o.stdout));
}

#[test]
fn one_big_dict_referenced_many_times_imports_in_linear_time() {
    // 100,000 trace entries that are one dict of 30,000 keys: re-walking it at every reference
    // took minutes. PyTorch writes every entry as a dict of its own: the repeats are skipped,
    // as repeated segments and annotations are (a copy per reference, one byte of input each
    // through `DUP`, took 2.0 GB for 10 MB).
    let f = fixture("quadratic_entries.pickle");
    let (o, took) = run(&["import", "torch", path(&f), "-o", path(&tmp("quad.atrace"))]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("imported 1 trace entries"), "{out}");
    assert!(
        out.contains("99999 trace entries (the first: trace entry 1) repeat an earlier entry object; skipped"),
        "{out}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn negative_sizes_read_as_zero_with_a_warning_naming_the_entry() {
    // Was: a size of -512 became 2^64 - 512.
    let f = fixture("negative_size.pickle");
    let t = tmp("neg.atrace");
    let (o, _) = run(&["import", "torch", path(&f), "-o", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("warning: trace entry 0 has a negative `size` (-512); read as 0"), "{out}");
    assert!(out.contains("warning: trace entry 1 has a negative `size` (-1); read as 0"), "{out}");
    let (o, _) = run(&["summary", path(&t)]);
    assert!(text(&o.stdout).contains("peak requested          0 B"), "{}", text(&o.stdout));
}

#[test]
fn concatenated_traces_are_corrupt_at_the_second() {
    // Was: `cat a b > c` read as one complete trace.
    let a = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/seed_experiments.default.atrace");
    let bytes = std::fs::read(&a).unwrap();
    let c = tmp("cat.atrace");
    std::fs::write(&c, [bytes.as_slice(), bytes.as_slice()].concat()).unwrap();
    expect(
        &["summary", path(&c)],
        3,
        &format!(
            "corrupt at byte {}: data after the trailer (a trace ends with its trailer; were files concatenated?)",
            bytes.len()
        ),
        30,
    );
}

#[test]
fn reports_stay_within_their_output_bound() {
    // Every report file is at most MAX_REPORT_FILE_BYTES (a 2.1 KB trace once wrote 1.07 GB);
    // the shipped reports are far below it.
    let bound = analyzer::render::report::MAX_REPORT_FILE_BYTES as u64;
    let reports = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reports");
    for dir in std::fs::read_dir(&reports).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let total: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(total < bound / 8, "{} holds {total} bytes", dir.display());
    }
}

#[test]
fn outputs_past_their_bound_are_refused_with_exit_3() {
    // 6.5 M events in 12 KB: its memory_viz export would pass 256 MiB (it wrote 282 MB), and
    // then exited 2 like a bad input. Now exit 3, the reason, and no file.
    let out = tmp("time100.pickle");
    let f = fixture("time100.atrace");
    expect_uncapped(
        &["export", path(&f), "--format", "memory-viz", "-o", path(&out)],
        3,
        "the export would pass 268435456 bytes, the most an export writes; nothing was written",
        240,
    );
    assert!(!out.exists(), "no export is left");
    // 655,360 live allocations: the segment map drew one rectangle per block, and report.html
    // would have passed 16 MiB (56 MB). Blocks of one colour side by side are one rectangle
    // now: the report is written, its pictures small.
    let dir = tmp("live10-report");
    expect_uncapped(&["report", path(&fixture("live10.atrace")), "-o", path(&dir)], 0, "", 240);
    for (file, most) in [("segments.svg", 1 << 20), ("report.html", 4 << 20)] {
        let bytes = std::fs::metadata(dir.join(file)).unwrap().len();
        assert!(bytes < most, "{file}: {bytes} bytes");
    }
    // 262,144 streams, one segment each: summary.json would pass 16 MiB (the fragmentation
    // moment lists 40,960 segments). Once report.md was written before the refusal; no file
    // of the report is.
    let dir = tmp("streams8-report");
    let o = expect_uncapped(
        &["report", path(&fixture("streams8.atrace")), "-o", path(&dir)],
        3,
        "streams8-report/summary.json would be ",
        240,
    );
    let err = text(&o.stderr);
    let bytes: u64 = err.split("would be ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!((16_777_217..20_000_000).contains(&bytes), "{err}");
    assert!(err.contains("more than the 16777216 a report file may hold; no file of the report was written"), "{err}");
    assert!(!dir.exists(), "no file of the report is left");
}

/// Writes a trace of `events` (times 0, 1, 2, ...) with a 1 GiB limit.
fn write_trace(name: &str, events: Vec<recorder::trace::Event>) -> PathBuf {
    use recorder::trace::{Header, Record, Source, TraceWriter};
    let p = tmp(name);
    let mut h = Header::new(Source::Recorded);
    h.capacity_bytes = 1 << 30;
    let mut w = TraceWriter::create(&p, &h).unwrap();
    for (i, event) in events.into_iter().enumerate() {
        w.write_owned(Record { time_ns: i as u64, event }).unwrap();
    }
    w.finish().unwrap();
    p
}

#[test]
fn requests_near_2_to_the_64_and_reused_ids_are_findings_not_failures() {
    use recorder::trace::{Event, Pool};
    let huge = 1u64 << 60;
    let alloc = |id: u64, addr: u64, bytes: u64| Event::Alloc {
        id,
        addr,
        requested_bytes: bytes,
        block_bytes: 0,
        stream: 0,
        pool: Pool::Large,
        callsite: 0,
    };
    let t = write_trace(
        "huge.atrace",
        vec![
            alloc(1, 0x1000, 1 << 20),
            alloc(1, 0x2000, 1 << 20),
            alloc(2, 0x3000, u64::MAX - 5),
            alloc(3, 0x4000, 100),
            Event::Oom {
                requested_bytes: huge,
                alloc_bytes: huge,
                device_free_bytes: 0,
                reserved_bytes: 0,
                allocated_bytes: 0,
                limit_bytes: 1 << 30,
                stream: 0,
            },
        ],
    );
    let (o, _) = run(&["summary", path(&t)]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(out.contains("anomalies    1 (frees of unknown blocks, allocations that reuse a live id)"), "{out}");
    assert!(out.contains("16384.00 PiB"), "sums saturate instead of wrapping: {out}");
    for cmd in ["explain", "replay", "leaks"] {
        let (o, _) = run(&[cmd, path(&t)]);
        assert!(matches!(o.status.code(), Some(0)), "{cmd}: {}\n{}", text(&o.stderr), text(&o.stdout));
    }
}

// Round two: small files that cost large memory or time, and trace text that was live markup.

#[test]
fn a_stream_per_allocation_replays_in_bounded_time() {
    // 65,536 events, every allocation on a new stream (197 bytes). Was: `replay` 15 s and
    // 761 MB, `report` killed at 23.7 GB (the engine kept 23 KiB per stream and walked every
    // stream and segment at each step).
    let f = fixture("streams1.atrace");
    for cmd in ["summary", "replay", "leaks", "dump"] {
        let (o, took) = run(&[cmd, path(&f)]);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", text(&o.stderr));
        assert!(took < Duration::from_secs(30), "{cmd} took {took:?}");
    }
    let (o, _) = run(&["replay", path(&f)]);
    assert!(text(&o.stdout).contains("outcome         ok (32768 requests replayed)"), "{}", text(&o.stdout));
    // The report names the first streams' handles, not 32,768 of them (a note that long made
    // the report run past 20 s in a release build).
    let dir = tmp("streams1-report");
    let (o, took) = run(&["report", path(&f), "-o", path(&dir)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(took < Duration::from_secs(90), "report took {took:?}");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.replace('\n', " ").contains("stream 16 = handle 0x10, and 32752 more"), "{md}");
    // Perfetto: per-stream tracks for the first 64 streams only (was 17.6 MB here, and 353 MB
    // in 223 s for a 2.6 KB trace).
    let json = tmp("streams1.json");
    let (o, _) = run(&["export", "--format", "perfetto", "-o", path(&json), path(&f)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("(32768 streams)"), "{}", text(&o.stdout));
    assert!(std::fs::metadata(&json).unwrap().len() < 1 << 20, "one set of all-streams tracks");
}

#[test]
fn a_mark_of_32_mib_is_corrupt_at_its_chunk() {
    // Ten chunks of one 32 MiB mark each, about 1 KB apiece compressed. Was: 3.4 GB for a
    // 106 KB trace in `replay`, `report` and `explain` (the budget counted records).
    let f = fixture("mark32M_x10.atrace");
    for cmd in ["summary", "explain", "replay", "dump"] {
        expect(
            &[cmd, path(&f)],
            3,
            "corrupt at byte 66: event 0 of the chunk (at byte 0 of its body) does not decode: mark text of 33554368 \
             bytes; a writer cuts texts to 4096; analyzed the 0 events before the damage",
            10,
        );
    }
}

#[test]
fn a_call_site_name_of_1_mib_is_corrupt_at_its_chunk() {
    // Was: `report` still drawing its pictures after 5 minutes.
    // And `plot --kind whatif` on its empty prefix: it once reserved room for as many replays
    // side by side as 1 GiB allows at no live allocation, a billion (abort, exit 134).
    let f = fixture("longcs1M.atrace");
    let dir = tmp("longcs-report");
    let svg = tmp("longcs-whatif.svg");
    for args in [
        vec!["summary", path(&f)],
        vec!["report", path(&f), "-o", path(&dir)],
        vec!["plot", path(&f), "--kind", "whatif", "-o", path(&svg)],
    ] {
        expect(
            &args,
            3,
            "corrupt at byte 66: event 1 of the chunk (at byte 18 of its body) does not decode: frame function of \
             1048576 bytes; a writer cuts texts to 4096",
            20,
        );
    }
}

#[test]
fn activation_sizes_whose_sum_wraps_are_no_panic() {
    // Two activations of 3 * 2^62 bytes each. Was: exit 101 (an index past the checkpointing
    // estimate's blocks) in `summary`, `explain` and `report`, from a trace or a snapshot.
    let f = fixture("cat_panic.atrace");
    for cmd in ["summary", "explain"] {
        let (o, _) = run(&[cmd, path(&f)]);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", text(&o.stderr));
    }
    let (o, _) = run(&["summary", path(&f)]);
    assert!(text(&o.stdout).contains("activation"), "categories are computed: {}", text(&o.stdout));
    let t = tmp("cat_panic.atrace");
    let (o, _) = run(&["import", "torch", path(&fixture("cat_panic.pickle")), "-o", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    for cmd in ["summary", "explain"] {
        let (o, _) = run(&[cmd, path(&t)]);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", text(&o.stderr));
    }
}

#[test]
fn never_freed_and_compressible_events_take_bounded_time_in_summary() {
    // 655,360 allocations never freed (1.6 KB), and 6.5 M events in 12 KB, read whole.
    for (name, events) in [("live10.atrace", "655360"), ("time100.atrace", "6553600")] {
        let f = fixture(name);
        let (o, took) = run_env(&["summary", path(&f)], UNCAPPED);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o.stderr));
        assert!(text(&o.stdout).contains(&format!("events       {events} ")), "{}", text(&o.stdout));
        assert!(took < Duration::from_secs(60), "{name}: {took:?}");
    }
}

#[test]
fn compressible_events_past_4_per_byte_are_cut_as_damage() {
    // 6.5 M events in 12 KB made `report` run 10 s, and its 123 KB sibling 149 s: time grew with
    // events, not bytes. A recording holds about one event per byte or fewer; past 4 per byte
    // of the file and a chunk (65,536) the rest is damage, analyzed up to there (exit 3).
    let f = fixture("time100.atrace");
    let needle = "corrupt at byte 181: the chunk here would take the trace past 115032 events (4 per byte of its \
12374-byte file, and a chunk)";
    for cmd in ["summary", "replay", "explain", "leaks", "whatif", "frag"] {
        let o = expect(&[cmd, path(&f)], 3, needle, 30);
        assert!(text(&o.stderr).contains("analyzed the 65536 events before the damage"), "{}", text(&o.stderr));
    }
    // Another bound, and none.
    let (o, _) = run_env(&["summary", path(&f)], &[("ALLOCTRACE_MAX_EVENTS_PER_BYTE", "100")]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o.stderr).contains("past 1302936 events (100 per byte"), "{}", text(&o.stderr));
    let (o, _) = run_env(&["summary", path(&f)], UNCAPPED);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn a_snapshot_of_edge_opcodes_and_numbers_imports_with_warnings() {
    let f = fixture("pk_edges.pickle");
    let t = tmp("pk_edges.atrace");
    let (o, _) = run(&["import", "torch", path(&f), "-o", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("garbage_collection_threshold must be in (0, 1) (got inf)"), "{out}");
    assert_no_controls(&out, "import");
    let (o, _) = run(&["summary", path(&t)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn links_mentions_and_dash_runs_in_names_are_not_live_in_a_report() {
    // Was: live links (also "see https://..." inside the diagnosis), mentions, and a dash run
    // in a function name wrapped onto a line of its own: a setext heading.
    for name in ["inject_url.atrace", "inject_dash.atrace", "inject.atrace"] {
        let f = fixture(name);
        let dir = tmp(&format!("{name}-report"));
        let (o, _) = run(&["report", path(&f), "-o", path(&dir)]);
        assert!(matches!(o.status.code(), Some(0 | 3)), "{name}: {}", text(&o.stderr));
        assert_report_is_inert(&dir);
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        // Nothing in a fenced code block is live (PyTorch's own message, with its documentation
        // link, is quoted in one).
        let mut fenced = false;
        for line in md.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced || line.starts_with("|---") {
                continue;
            }
            let live = markdown_outside_code(line);
            for bad in ["http://", "https://", "www.", "mailto:", "@"] {
                assert!(!live.to_ascii_lowercase().contains(bad), "{name}: a live {bad} in: {line}");
            }
            let t = line.trim();
            let underline = !t.is_empty() && (t.chars().all(|c| c == '-') || t.chars().all(|c| c == '='));
            assert!(!underline || t.len() < 3, "{name}: a heading underline: {line}");
        }
    }
}

#[test]
fn noncharacters_and_invisible_characters_are_shown_escaped() {
    // U+FFFE and U+FFFF are not allowed in XML: `plot` wrote an SVG no XML parser reads.
    let f = fixture("xmlbad.atrace");
    let svg = tmp("xmlbad.svg");
    let (o, _) = run(&["plot", path(&f), "-o", path(&svg)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(!s.contains(['\u{fffe}', '\u{ffff}']), "raw noncharacters in the SVG");
    let (o, _) = run(&["summary", path(&f)]);
    assert!(!text(&o.stdout).contains(['\u{fffe}', '\u{ffff}', '\u{200e}', '\u{feff}']), "{}", text(&o.stdout));
}

/// Every string a trace holds: header texts, call-site files and functions, marks.
fn trace_strings(p: &Path) -> Vec<String> {
    use recorder::trace::{Event, TraceReader};
    let Ok(mut r) = TraceReader::open(p) else { return Vec::new() };
    let h = r.header().clone();
    let mut out = vec![h.device_name, h.alloc_conf, h.torch_version];
    out.extend(h.command_line);
    out.extend(h.notes);
    let mut records = Vec::new();
    while r.next_chunk(&mut records) {
        for rec in &records {
            match &rec.event {
                Event::CallSite { frames, .. } => {
                    out.extend(frames.iter().flat_map(|f| [f.file.clone(), f.function.clone()]))
                }
                Event::Mark { text, .. } => out.push(text.clone()),
                _ => {}
            }
        }
    }
    out
}

/// The words of `strings` (runs of letters and digits, 4 or more) that the report of a benign
/// trace does not use: what only the trace can have put into a report.
fn trace_words(strings: &[String]) -> std::collections::BTreeSet<String> {
    // The report's own words: all of frag_oom.default's report, and the headings of every
    // shipped report (the section and picture titles, such as "Live bytes by call site", which
    // only reports of traces with call sites have).
    let reports = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reports");
    let mut benign = std::fs::read_to_string(reports.join("frag_oom.default/report.md")).unwrap();
    for e in std::fs::read_dir(reports).unwrap() {
        let md = std::fs::read_to_string(e.unwrap().path().join("report.md")).unwrap_or_default();
        for heading in md.lines().filter(|l| l.starts_with('#')) {
            benign += "\n";
            benign += heading;
        }
    }
    let ours: std::collections::BTreeSet<&str> = benign.split(|c: char| !c.is_alphanumeric()).collect();
    strings
        .iter()
        .flat_map(|s| s.split(|c: char| !c.is_alphanumeric()))
        .filter(|w| w.len() >= 4 && !ours.contains(w))
        .map(str::to_string)
        .collect()
}

/// The text of `node` outside code spans, as a renderer shows it.
fn rendered_text<'a>(node: &'a comrak::nodes::AstNode<'a>) -> String {
    use comrak::nodes::NodeValue;
    node.descendants()
        .filter_map(|n| match &n.data.borrow().value {
            NodeValue::Text(t) => Some(t.to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `report.md` rendered as GitHub renders it (CommonMark with the GFM extensions autolink,
/// strikethrough, table and tagfilter): no link but the report's own pictures, no raw HTML,
/// no setext heading or rule, no mention, and no word of the trace's in a heading, bold,
/// emphasis or strikethrough; in `report.html`, no link and no word of the trace's in bold or
/// emphasis. Returns the number of nodes checked.
fn assert_trace_text_is_text(dir: &Path, words: &std::collections::BTreeSet<String>, what: &str) -> usize {
    use comrak::nodes::NodeValue;
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let arena = comrak::Arena::new();
    let mut options = comrak::Options::default();
    options.extension.autolink = true;
    options.extension.strikethrough = true;
    options.extension.table = true;
    options.extension.tagfilter = true;
    let root = comrak::parse_document(&arena, &md, &options);
    let own_file = |url: &str, ext: &str| {
        url.strip_suffix(ext).is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
    };
    let has_trace_word =
        |text: &str| words.iter().find(|w| text.split(|c: char| !c.is_alphanumeric()).any(|t| t == *w));
    let mut checked = 0;
    for node in root.descendants() {
        checked += 1;
        let value = node.data.borrow().value.clone();
        match value {
            NodeValue::Link(l) => assert!(own_file(&l.url, ".svg"), "{what}: a link to {:?} in report.md", l.url),
            NodeValue::Image(l) => assert!(own_file(&l.url, ".png"), "{what}: an image {:?} in report.md", l.url),
            NodeValue::HtmlInline(h) => panic!("{what}: raw HTML {h:?} in report.md"),
            NodeValue::HtmlBlock(h) => panic!("{what}: an HTML block {:?} in report.md", h.literal),
            NodeValue::ThematicBreak => panic!("{what}: a rule in report.md"),
            NodeValue::Heading(h) => {
                assert!(!h.setext, "{what}: a setext heading {:?} in report.md", rendered_text(node));
                if let Some(w) = has_trace_word(&rendered_text(node)) {
                    panic!("{what}: the trace's `{w}` in a heading: {:?}", rendered_text(node));
                }
            }
            NodeValue::Strong | NodeValue::Emph | NodeValue::Strikethrough => {
                if let Some(w) = has_trace_word(&rendered_text(node)) {
                    panic!("{what}: the trace's `{w}` in {:?}: {:?}", value, rendered_text(node));
                }
            }
            NodeValue::Text(t) => {
                let mention = t.match_indices('@').any(|(i, _)| t[i + 1..].starts_with(|c: char| c.is_alphanumeric()));
                assert!(!mention, "{what}: a mention outside code in report.md: {t:?}");
            }
            _ => {}
        }
    }
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(!html.contains("<a "), "{what}: a link in report.html");
    for tag in ["strong", "em"] {
        for part in html.split(&format!("<{tag}>")).skip(1) {
            let inner = part.split(&format!("</{tag}>")).next().unwrap();
            // Code inside bold is literal: only the text around it counts.
            let text: String = inner.split("<code>").map(|p| p.split_once("</code>").map_or(p, |x| x.1)).collect();
            if let Some(w) = has_trace_word(&text) {
                panic!("{what}: the trace's `{w}` in <{tag}> in report.html: {inner:?}");
            }
        }
    }
    checked
}

#[test]
fn trace_text_is_text_under_a_gfm_renderer() {
    // Was: `**` right after a backtick that closed the report's own code span around a trace
    // string became bold (and `*` emphasis) in report.md and report.html; a trace's own `**`
    // in a note or a call-site function did too.
    use recorder::trace::{Event, Frame, Header, MarkKind, Pool, Record, Source, TraceWriter};
    // With backticks that pair among themselves, and without any (then a call site's `**` in a
    // sentence of the analyses, the advice or the growth note, was bold in report.md).
    let payloads = [
        (
            "payload-everywhere.atrace",
            "f` **BOLD-PAYLOAD** *EM-PAYLOAD* ~~STRIKE-PAYLOAD~~ `g <b>HTML-PAYLOAD</b> @MENTIONPAYLOAD \
                   https://LINKPAYLOAD.example www.WWWPAYLOAD.example",
        ),
        ("payload-plain.atrace", "**BOLD-PAYLOAD** *EM-PAYLOAD* _UNDER-PAYLOAD_ ~~STRIKE-PAYLOAD~~"),
    ];
    let mut generated = Vec::new();
    for (file, payload) in payloads {
        let all = tmp(file);
        let mut h = Header::new(Source::Recorded);
        h.capacity_bytes = 1 << 30;
        h.device_name = payload.replace("PAYLOAD", "DEVICE");
        h.command_line = vec!["python".into(), payload.replace("PAYLOAD", "COMMAND")];
        h.notes = vec![payload.replace("PAYLOAD", "NOTE"), "**BOLDNOTE**".into(), "----------".into()];
        let mut w = TraceWriter::create(&all, &h).unwrap();
        let frame =
            Frame { file: payload.replace("PAYLOAD", "FILE"), line: 7, function: payload.replace("PAYLOAD", "FUNC") };
        let mut events = vec![Event::CallSite { id: 1, frames: vec![frame] }];
        for i in 0..40u64 {
            events.push(Event::Mark { kind: MarkKind::Iteration, text: payload.replace("PAYLOAD", "MARK") });
            events.push(Event::Alloc {
                id: i + 1,
                addr: 0x1000_0000 + i * (1 << 20),
                requested_bytes: 1 << 20,
                block_bytes: 0,
                stream: 0,
                pool: Pool::Large,
                callsite: 1,
            });
        }
        for (i, event) in events.into_iter().enumerate() {
            w.write_owned(Record { time_ns: i as u64, event }).unwrap();
        }
        w.finish().unwrap();
        generated.push(all);
    }
    let mut inputs: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "atrace"))
            .collect();
    inputs.sort();
    inputs.extend(generated);
    let mut reports = 0;
    for f in &inputs {
        let name = f.file_name().unwrap().to_str().unwrap();
        let words = trace_words(&trace_strings(f));
        if words.is_empty() {
            // Nothing of the trace's own could be live (the streams, live and time inputs).
            println!("{name}: no text of its own");
            continue;
        }
        let dir = tmp(&format!("gfm-{name}"));
        let (o, _) = run(&["report", path(f), "-o", path(&dir), "--force"]);
        if o.status.code() != Some(0) {
            println!("{name}: report exits {:?}: {}", o.status.code(), text(&o.stderr).trim());
            continue;
        }
        let checked = assert_trace_text_is_text(&dir, &words, name);
        println!("{name}: {checked} nodes of report.md checked against {} words of the trace", words.len());
        reports += 1;
    }
    assert!(reports >= 6, "only {reports} reports were checked");
}

/// A call site whose function name holds a newline, a tab, a backtick and `**`: `--json` (and
/// the analyses inside `summary.json`) carries it as the trace holds it; the text outputs show it
/// escaped once, on its line; the report's findings in `summary.json` hold none of the report's
/// markup, and `report.md` still escapes the name.
#[test]
fn a_function_name_is_raw_in_json_and_escaped_once_in_text() {
    // Was: `\n` (a backslash and an `n`) in every `--json`, a raw tab on the terminal, and code
    // spans and backslash escapes of the report's markup in `summary.json`'s findings.
    use recorder::trace::{Event, Frame, MarkKind, Pool};
    const NAME: &str = "step\nINJECTED\t`tick`**bold**";
    // As a text output shows it: once escaped.
    const SHOWN: &str = "step\\nINJECTED\\t`tick`**bold**";
    let label = format!("train.py:7 ({NAME})");
    let mut events = vec![Event::CallSite {
        id: 1,
        frames: vec![Frame { file: "train.py".into(), line: 7, function: NAME.into() }],
    }];
    for i in 0..40u64 {
        events.push(Event::Mark { kind: MarkKind::Iteration, text: format!("iteration {i}") });
        events.push(Event::Alloc {
            id: i + 1,
            addr: 0x1000_0000 + i * (2 << 20),
            requested_bytes: 2 << 20,
            block_bytes: 0,
            stream: 0,
            pool: Pool::Large,
            callsite: 1,
        });
    }
    let t = write_trace("raw-name.atrace", events);
    let json = |args: &[&str]| -> serde_json::Value {
        let (o, _) = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("valid JSON")
    };
    // (a) JSON: the name as the trace holds it.
    let explain = json(&["explain", "--json", path(&t)]);
    let site = &explain["top_sites"][0]["site"];
    assert_eq!(site["function"], NAME, "{site}");
    assert_eq!(site["label"], label.as_str(), "{site}");
    assert!(explain["verdict"]["reason"].as_str().unwrap().contains(&label), "{}", explain["verdict"]);
    let leaks = json(&["leaks", "--json", path(&t)]);
    assert_eq!(leaks["live_at_end"][0]["site"]["label"], label.as_str(), "{}", leaks["live_at_end"]);
    assert_eq!(leaks["growth"]["sites"][0]["site"]["function"], NAME, "{}", leaks["growth"]);
    // (b) Text: on its line, escaped once.
    for args in [vec!["explain"], vec!["explain", "--verbose"], vec!["leaks"]] {
        let mut args = args;
        args.push(path(&t));
        let (o, _) = run(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        let out = text(&o.stdout);
        assert!(out.contains(SHOWN), "{args:?} does not show the name escaped once:\n{out}");
        assert!(!out.contains('\t') && !out.contains("\\\\"), "{args:?}: a raw tab or an escape escaped:\n{out}");
        for line in out.lines().filter(|l| l.contains("INJECTED")) {
            assert!(line.contains(SHOWN), "{args:?}: the name is cut: {line:?}\n{out}");
        }
    }
    // (c) The report: its findings in summary.json are plain text; report.md escapes the name.
    let dir = tmp("raw-name-report");
    let (o, _) = run(&["report", path(&t), "-o", path(&dir), "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let mut named = 0;
    for f in summary["findings"].as_array().unwrap() {
        for key in ["title", "value", "definition", "explanation"] {
            let s = f[key].as_str().unwrap();
            named += s.matches(&label).count();
            // What is left once the trace's own name is taken out is the report's: no markup.
            let ours = s.replace(&label, "");
            assert!(!ours.contains(['`', '\\']) && !ours.contains("**"), "{}.{key} holds markup: {s:?}", f["id"]);
        }
    }
    assert!(named >= 2, "the findings name the call site (as code and as text): {}", summary["findings"]);
    assert_eq!(summary["leaks"]["live_at_end"][0]["site"]["label"], label.as_str());
    assert_eq!(summary["explain"]["top_sites"][0]["site"]["label"], label.as_str());
    assert_report_is_inert(&dir);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(!md.lines().any(|l| l.starts_with("INJECTED")), "the name broke its line in report.md");
    assert!(md.contains("step\\nINJECTED\\t"), "report.md shows the name escaped:\n{md}");
    assert!(!md.contains("\\\\nINJECTED"), "report.md escapes the name twice:\n{md}");
    assert!(!md.contains('\t'), "a raw tab in report.md");
}

/// What one command cost: exit code (`None`: killed by a signal), peak resident memory in bytes,
/// wall time, and the last line it wrote on stderr.
struct Cost {
    code: Option<i32>,
    peak_rss: u64,
    took: Duration,
    stderr: String,
}

/// Runs `bin` with `args`, its output discarded, and measures it with `wait4`; killed past
/// `limit` (then `code` is `None`).
fn measure(bin: &Path, args: &[String], limit: Duration) -> Cost {
    let err = tmp(&format!("stderr-{}", args.len()));
    let start = Instant::now();
    let child = Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("run alloctrace");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain data that `wait4` fills in; `pid` is our own child, reaped here
    // (std's `Child` is dropped without waiting).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid {
            break;
        }
        if start.elapsed() > limit {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = start.elapsed();
    drop(child);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    Cost { code, peak_rss: usage.ru_maxrss as u64 * 1024, took, stderr: stderr.lines().last().unwrap_or("").into() }
}

/// `f` ten times larger: its records ten times over (later copies shifted in time, with fresh
/// allocation ids, and on fresh streams where the original left the default stream; call sites
/// are defined once), or, where its first chunk is already damaged, its chunks ten times over
/// (the reader stops at the first damage whatever follows). Streamed a chunk at a time: the
/// memory of this process is the floor of every figure `wait4` gives for its children.
fn ten_times(f: &Path, out: &Path) {
    use recorder::trace::{Event, Record, TraceReader, TraceWriter};
    let (mut span, mut ids, mut streams, mut any) = (0u64, 0u64, 0u64, false);
    let mut chunk = Vec::new();
    let mut r = TraceReader::open(f).unwrap();
    let header = r.header().clone();
    let body_at = r.offset() as usize;
    while r.next_chunk(&mut chunk) {
        for r in &chunk {
            any = true;
            span = span.max(r.time_ns.saturating_add(1));
            match r.event {
                Event::Alloc { id, stream, .. } => (ids, streams) = (ids.max(id), streams.max(stream)),
                Event::FreeRequested { id, .. } | Event::FreeCompleted { id, .. } => ids = ids.max(id),
                _ => {}
            }
        }
    }
    if !any {
        let bytes = std::fs::read(f).unwrap();
        let mut big = bytes[..body_at].to_vec();
        for _ in 0..10 {
            big.extend_from_slice(&bytes[body_at..]);
        }
        std::fs::write(out, big).unwrap();
        return;
    }
    let mut w = TraceWriter::create(out, &header).unwrap();
    for k in 0..10u64 {
        let mut r = TraceReader::open(f).unwrap();
        while r.next_chunk(&mut chunk) {
            for r in chunk.drain(..) {
                let mut event = r.event;
                match &mut event {
                    Event::CallSite { .. } if k > 0 => continue,
                    Event::Alloc { id, stream, .. } => {
                        *id = id.wrapping_add(k.wrapping_mul(ids));
                        if *stream != 0 {
                            *stream = stream.wrapping_add(k.wrapping_mul(streams));
                        }
                    }
                    Event::FreeRequested { id, .. } | Event::FreeCompleted { id, .. } => {
                        *id = id.wrapping_add(k.wrapping_mul(ids))
                    }
                    Event::SegmentAlloc { stream, .. }
                    | Event::SegmentFree { stream, .. }
                    | Event::SegmentMap { stream, .. }
                    | Event::SegmentUnmap { stream, .. }
                    | Event::Oom { stream, .. }
                        if *stream != 0 =>
                    {
                        *stream = stream.wrapping_add(k.wrapping_mul(streams))
                    }
                    _ => {}
                }
                w.write_owned(Record { time_ns: r.time_ns.saturating_add(k.saturating_mul(span)), event }).unwrap();
            }
        }
    }
    w.finish().unwrap();
}

/// This process's peak resident memory (`VmHWM`), in bytes.
fn own_peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Every command over every input of the second hostile round and over its variant ten times
/// larger, within 1.5 GB and with exit 0, 2 or 3. Prints the peak memory and the time of each
/// run (times are the machine's, not asserted). Minutes even in a release build; run it with
/// that binary (a path from the workspace's root, or absolute):
///
/// ```text
/// cargo build --release -p alloctrace
/// ALLOCTRACE_BIN=target/release/alloctrace \
///     cargo test -p alloctrace --test hostile every_command -- --ignored --nocapture
/// ```
///
/// `ALLOCTRACE_LIMIT_S=60` kills a run past 60 s (listed, not failed); `ALLOCTRACE_ONLY=live10`
/// runs the inputs whose name holds `live10`.
#[test]
#[ignore = "minutes: run with ALLOCTRACE_BIN=target/release/alloctrace and --ignored"]
fn every_command_over_ten_times_larger_inputs_within_1_5_gb() {
    const BOUND: u64 = 1_500_000_000;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin =
        std::env::var_os("ALLOCTRACE_BIN").map_or(PathBuf::from(env!("CARGO_BIN_EXE_alloctrace")), |b| root.join(b));
    // A limit on each run (killed past it), to bound the harness's own time; none by default.
    let limit = Duration::from_secs(std::env::var("ALLOCTRACE_LIMIT_S").map_or(u64::MAX >> 2, |s| s.parse().unwrap()));
    let only = std::env::var("ALLOCTRACE_ONLY").ok();
    let dir = tmp("ten-times");
    std::fs::create_dir_all(&dir).unwrap();
    let names = [
        "streams1.atrace",
        "streams8.atrace",
        "mark32M_x10.atrace",
        "longcs1M.atrace",
        "live10.atrace",
        "time100.atrace",
        "cat_panic.atrace",
        "inject.atrace",
        "inject_dash.atrace",
        "inject_url.atrace",
        "xmlbad.atrace",
        "cat_panic.pickle",
        "pk_edges.pickle",
    ];
    let mut inputs = Vec::new();
    for name in names {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let f = fixture(name);
        inputs.push((name.to_string(), f.clone()));
        // A snapshot is made ten times larger as the trace it imports to.
        let trace = if name.ends_with(".pickle") {
            let t = dir.join(format!("{name}.atrace"));
            let (o, _) = run(&["import", "torch", path(&f), "-o", path(&t)]);
            assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o.stderr));
            t
        } else {
            f
        };
        let big = dir.join(format!("x10-{name}.atrace"));
        ten_times(&trace, &big);
        inputs.push((format!("x10 {name}"), big));
    }
    let (mut failures, mut unfinished) = (Vec::new(), Vec::new());
    // A child started with vfork and exec inherits this process's peak as its own floor.
    println!("this process's peak: {:.1} MB (the floor of every figure below)", own_peak_rss() as f64 / 1e6);
    println!("{:<26} {:<20} {:>4} {:>9} {:>8}", "input", "command", "exit", "peak MB", "time s");
    for (name, f) in &inputs {
        let size = std::fs::metadata(f).unwrap().len();
        println!("{name} ({size} bytes)");
        let f = path(f).to_string();
        let out = |n: &str| dir.join(n).to_str().unwrap().to_string();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
        let mut commands: Vec<(&str, Vec<String>)> = vec![
            ("summary", s(&["summary", &f])),
            ("dump", s(&["dump", &f])),
            ("replay", s(&["replay", &f])),
            ("whatif", s(&["whatif", &f])),
            ("explain", s(&["explain", &f])),
            ("frag", s(&["frag", &f])),
            ("leaks", s(&["leaks", &f])),
            ("plot", s(&["plot", &f, "-o", &out("plot.svg")])),
            ("plot whatif", s(&["plot", "--kind", "whatif", &f, "-o", &out("plot.svg")])),
            ("plot frag", s(&["plot", "--kind", "frag", &f, "-o", &out("plot.svg")])),
            ("plot segments", s(&["plot", "--kind", "segments", &f, "-o", &out("plot.svg")])),
            ("report", s(&["report", &f, "-o", &out("report"), "--force"])),
            ("export perfetto", s(&["export", &f, "--format", "perfetto", "-o", &out("export.json")])),
            ("export memory-viz", s(&["export", &f, "--format", "memory-viz", "-o", &out("export.pickle")])),
            ("diff", s(&["diff", &f, &f])),
            ("ranks", s(&["ranks", &f, &f])),
        ];
        if f.ends_with(".pickle") {
            commands.push(("import", s(&["import", "torch", &f, "-o", &out("import.atrace")])));
        }
        for (what, args) in commands {
            for p in ["export.json", "export.pickle", "plot.svg", "import.atrace"] {
                let _ = std::fs::remove_file(dir.join(p));
            }
            let c = measure(&bin, &args, limit);
            let code = c.code.map_or("kill".into(), |c| c.to_string());
            println!(
                "{:<26} {:<20} {:>4} {:>9.1} {:>8.2}  {}",
                "",
                what,
                code,
                c.peak_rss as f64 / 1e6,
                c.took.as_secs_f64(),
                if c.code == Some(0) { "" } else { c.stderr.as_str() }
            );
            if c.code.is_none() && c.took >= limit {
                // Past the harness's own limit: a time, which is printed, not asserted.
                unfinished.push(format!(
                    "{name} {what}: over {} s, {} MB then",
                    limit.as_secs(),
                    c.peak_rss / 1_000_000
                ));
            } else if !matches!(c.code, Some(0 | 2 | 3)) {
                failures.push(format!("{name} {what}: exit {code}"));
            }
            if c.peak_rss > BOUND {
                failures.push(format!("{name} {what}: {} MB", c.peak_rss / 1_000_000));
            }
        }
    }
    if !unfinished.is_empty() {
        println!("not finished within ALLOCTRACE_LIMIT_S:\n{}", unfinished.join("\n"));
    }
    assert!(failures.is_empty(), "past the bound:\n{}", failures.join("\n"));
}
