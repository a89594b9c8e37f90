//! The CLI's contract: every error path prints one clear line naming the file and exits 2; a
//! damaged trace is analyzed up to the damage and exits 3; `--json` keys are stable.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn trace(name: &str) -> PathBuf {
    root().join("traces").join(format!("{name}.atrace"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run alloctrace")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The JSON a command prints, checking that it exits with `code`.
fn json_of(args: &[&str], code: i32) -> serde_json::Value {
    let o = run(args);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// One line on stderr, starting with `alloctrace: error:`, exit code 2.
fn assert_error(o: &Output, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {e}");
    assert_eq!(e.trim_end().lines().count(), 1, "one line expected: {e}");
    assert!(e.starts_with("alloctrace: error: "), "{e}");
    assert!(e.contains(needle), "`{needle}` not in: {e}");
}

#[test]
fn missing_file_names_it() {
    for cmd in ["summary", "dump", "replay", "whatif"] {
        let o = run(&[cmd, "/nonexistent/x.atrace"]);
        assert_error(&o, "/nonexistent/x.atrace");
    }
}

#[test]
fn foreign_file_is_refused_with_offset() {
    let f = root().join("Cargo.toml");
    let o = run(&["summary", f.to_str().unwrap()]);
    assert_error(&o, "not an alloctrace trace");
    assert!(stderr(&o).contains("Cargo.toml") && stderr(&o).contains("byte 0"), "{}", stderr(&o));
    // The error says what the commands read; a checkpoint (torch.save writes a zip) is named.
    assert!(stderr(&o).contains("torch.cuda.memory._dump_snapshot"), "{}", stderr(&o));
    let zip = tmp("model.pickle");
    std::fs::write(&zip, b"PK\x03\x04rest of a zip").unwrap();
    let o = run(&["explain", zip.to_str().unwrap()]);
    assert_error(&o, "zip archive, as torch.save writes a checkpoint");
}

/// Every analysis takes a PyTorch snapshot as it takes a trace: imported in memory, the same
/// answer as from the imported trace.
#[test]
fn every_analysis_takes_a_snapshot() {
    let pickle = root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let imported = tmp("one-opener.atrace");
    let o = run(&["import", "torch", pickle.to_str().unwrap(), "-o", imported.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for cmd in ["summary", "replay", "leaks"] {
        let a = run(&[cmd, "--json", pickle.to_str().unwrap()]);
        let b = run(&[cmd, "--json", imported.to_str().unwrap()]);
        assert_eq!(a.status.code(), Some(0), "{cmd}: {}", stderr(&a));
        let (mut a, mut b): (serde_json::Value, serde_json::Value) =
            (serde_json::from_slice(&a.stdout).unwrap(), serde_json::from_slice(&b.stdout).unwrap());
        // The file's own name differs; everything else is the same answer.
        for v in [&mut a, &mut b] {
            if let Some(m) = v.as_object_mut() {
                m.remove("trace");
            }
        }
        assert_eq!(a, b, "{cmd} on the snapshot and on its import");
    }
    let svg = tmp("one-opener.svg");
    let o = run(&["plot", pickle.to_str().unwrap(), "--kind", "timeline", "-o", svg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["diff", pickle.to_str().unwrap(), imported.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // dump and export too: the events of the import, and the same export as from it.
    let (a, b) = (run(&["dump", pickle.to_str().unwrap()]), run(&["dump", imported.to_str().unwrap()]));
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let events = |o: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.starts_with('#')).map(String::from).collect()
    };
    assert!(events(&a).len() > 100 && events(&a) == events(&b), "dump of the snapshot and of its import");
    for format in ["perfetto", "memory-viz"] {
        let (x, y) = (tmp(&format!("one-opener-{format}.a")), tmp(&format!("one-opener-{format}.b")));
        let o = run(&["export", pickle.to_str().unwrap(), "--format", format, "-o", x.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{format}: {}", stderr(&o));
        let o = run(&["export", imported.to_str().unwrap(), "--format", format, "-o", y.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{format}: {}", stderr(&o));
        let (x, y) = (std::fs::read(&x).unwrap(), std::fs::read(&y).unwrap());
        assert!(!x.is_empty() && x.len().abs_diff(y.len()) < 256, "{format}: {} vs {} bytes", x.len(), y.len());
    }
}

#[test]
fn newer_format_version_names_both_versions() {
    let mut bytes = std::fs::read(trace("seed_experiments.default")).unwrap();
    bytes[8] = 9;
    let f = tmp("newer.atrace");
    std::fs::write(&f, bytes).unwrap();
    let o = run(&["summary", f.to_str().unwrap()]);
    assert_error(&o, "version 9 is newer");
    assert!(stderr(&o).contains("version 1"));
}

#[test]
fn truncated_trace_is_analyzed_up_to_the_damage_and_exits_3() {
    let bytes = std::fs::read(trace("gpt2_train.default")).unwrap();
    let f = tmp("cut.atrace");
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let o = run(&["summary", "--json", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["truncated"], true);
    assert!(stderr(&o).contains("cut.atrace") && stderr(&o).contains("at byte"), "{}", stderr(&o));
}

#[test]
fn corrupt_frame_is_reported_with_its_offset() {
    let mut bytes = std::fs::read(trace("gpt2_train.default")).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    let f = tmp("flipped.atrace");
    std::fs::write(&f, &bytes).unwrap();
    let o = run(&["summary", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3));
    assert!(stderr(&o).contains("corrupt at byte"), "{}", stderr(&o));
    let o = run(&["dump", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stdout).contains("# end: corrupt at byte"));
}

#[test]
fn bad_flags_exit_2() {
    let t = trace("seed_experiments.default");
    let t = t.to_str().unwrap();
    for (args, needle) in [
        (vec!["replay", t, "--capacity", "6 bananas"], "unknown unit"),
        (vec!["replay", t, "--capacity", "0"], "leave --capacity out for the trace's own limit"),
        (vec!["whatif", t, "--capacity", "18446744073709551616"], "out of range"),
        (vec!["replay", t, "--conf", "max_split_size_mb:5"], "max_split_size_mb must be > 20"),
        (vec!["replay", t, "--conf", "expandable_segments:maybe"], "expandable_segments"),
        (vec!["summary", t, "--frobnicate"], "--frobnicate"),
        (vec!["nonsense"], "nonsense"),
    ] {
        let o = run(&args);
        assert_error(&o, needle);
    }
}

#[test]
fn import_refuses_foreign_and_truncated_files() {
    let out = tmp("x.atrace");
    let f = root().join("Cargo.toml");
    let o = run(&["import", "torch", f.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_error(&o, "Cargo.toml");
    assert!(stderr(&o).contains("not a pickle"), "{}", stderr(&o));

    let pickle = root().join("../shared/traces/torch/leak_list_append.default.pickle");
    if let Ok(bytes) = std::fs::read(&pickle) {
        let cut = tmp("cut.pickle");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let o = run(&["import", "torch", cut.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert_error(&o, "cut.pickle");
        assert!(stderr(&o).contains("byte"), "{}", stderr(&o));
    }
}

#[test]
fn summary_json_has_stable_keys() {
    let o = run(&["summary", "--json", trace("frag_oom.default").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in [
        "events",
        "peak_reserved_bytes",
        "peak_requested_bytes",
        "peak_allocated_bytes",
        "num_device_alloc",
        "num_device_free",
        "num_ooms",
        "truncated",
        "source",
    ] {
        assert!(j.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(j["source"], "imported-torch");
    assert_eq!(j["peak_reserved_bytes"], 1_929_379_840u64);
    assert_eq!(j["peak_allocated_bytes"], serde_json::Value::Null);
    assert_eq!(j["num_ooms"], 1);
    assert_eq!(j["truncated"], false);
}

#[test]
fn replay_json_reports_the_oom_and_counters() {
    let o = run(&["replay", "--json", trace("frag_oom.default").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["outcome"], "oom");
    assert!(j["oom_event"].as_u64().is_some());
    assert_eq!(j["oom"]["requested_bytes"], 1u64 << 30);
    for key in ["peak_allocated_bytes", "peak_reserved_bytes", "num_alloc_retries", "num_device_alloc"] {
        assert!(j[key].as_u64().is_some(), "missing key {key}");
    }
    assert_eq!(j["num_alloc_retries"], 1);
    // Without the 2 GiB limit the same requests complete.
    let o = run(&["replay", "--json", "--unlimited", trace("frag_oom.default").to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["outcome"], "ok");
    assert!(j["oom_event"].is_null());
}

#[test]
fn dump_lines_are_stable_and_complete() {
    let o = run(&["dump", trace("seed_experiments.default").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8(o.stdout).unwrap();
    let events: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(events.len(), 26);
    assert!(events[0].starts_with("0 "));
    assert_eq!(events.iter().filter(|l| l.contains(" cache_release cause=empty_cache")).count(), 2);
    assert!(text.lines().last().unwrap().starts_with("# end: complete (26 events)"));
}

#[test]
fn broken_pipe_exits_0() {
    use std::io::Read;
    let mut child = bin()
        .args(["dump", trace("gpt2_train.default").to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 64];
    child.stdout.as_mut().unwrap().read_exact(&mut buf).unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn replay_writes_a_simulated_trace_that_other_commands_read() {
    let out = tmp("sim.atrace");
    let o = run(&[
        "replay",
        trace("resnet50_train.default").to_str().unwrap(),
        "--conf",
        "expandable_segments:True",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["summary", "--json", out.to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["source"], "simulated");
    assert_eq!(j["alloc_conf"], "expandable_segments:True");
    // truth.tsv: resnet50_train expandable unlimited reserved 3139436544, allocated 3127351296.
    assert_eq!(j["peak_reserved_bytes"], 3_139_436_544u64);
    assert_eq!(j["peak_allocated_bytes"], 3_127_351_296u64);
}

#[test]
fn whatif_compares_policies_and_finds_capacities() {
    let o = run(&["whatif", "--json", trace("frag_oom.default").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["capacity_bytes"], 2u64 << 30, "the trace's own capacity is the default");
    let rows = j["rows"].as_array().unwrap();
    let row = |p: &str| rows.iter().find(|r| r["policy"] == p).unwrap_or_else(|| panic!("no row {p}"));
    assert_eq!(row("recorded")["outcome"], "oom");
    // Real PyTorch 2.11 ran out of memory with expandable segments too.
    assert_eq!(row("expandable_segments:True")["outcome"], "oom");
    for r in rows {
        let min = r["min_capacity_bytes"].as_u64().unwrap();
        assert!(min >= j["bounds"]["live_requested_peak_bytes"].as_u64().unwrap());
    }
    let plan = j["bounds"]["offline_plan_bytes"].as_u64().unwrap();
    assert!(plan >= j["bounds"]["live_requested_peak_bytes"].as_u64().unwrap());
    assert!(plan <= row("recorded")["min_capacity_bytes"].as_u64().unwrap());
}

/// PyTorch's message, restated above the verdict, suggests `expandable_segments:True` after every
/// out-of-memory error; where the replay rules it out, the line that does says so, and the text
/// and the JSON agree.
#[test]
fn the_setting_pytorchs_message_suggests_is_ruled_out_by_name() {
    let t = trace("frag_oom.default");
    let text = String::from_utf8_lossy(&run(&["explain", t.to_str().unwrap()]).stdout).into_owned();
    let j = json_of(&["explain", "--json", t.to_str().unwrap()], 0);
    assert!(j["pytorch_message"].as_str().unwrap().contains("expandable_segments:True to avoid fragmentation"));
    let line = j["not_advised"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .find(|l| l.starts_with("expandable_segments:True"));
    let line = line.unwrap_or_else(|| panic!("{}", j["not_advised"]));
    assert!(line.contains("PyTorch's message suggests it after every out-of-memory error"), "{line}");
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words(&text).contains(&words(line)), "{text}");
    // The other settings ruled out are not said to be PyTorch's suggestion.
    for l in j["not_advised"].as_array().unwrap().iter().filter_map(|l| l.as_str()) {
        assert_eq!(l.contains("PyTorch's message"), l.starts_with("expandable_segments:True"), "{l}");
    }
}

#[test]
fn help_teaches() {
    let o = run(&["--help"]);
    let h = String::from_utf8(o.stdout).unwrap();
    assert!(h.contains("Reserved is not allocated"));
    for cmd in ["import", "dump", "summary", "replay", "whatif"] {
        assert!(h.contains(cmd), "{cmd} missing from --help");
        let o = run(&[cmd, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        assert!(String::from_utf8(o.stdout).unwrap().contains("alloctrace"), "{cmd} --help has no example");
    }
}

/// `record` refuses what would make a long job record nothing, before the job starts: a trace
/// path that cannot be written, an allocator setting that does not exist. The program never runs.
#[test]
fn record_refuses_bad_output_and_settings_before_running_the_program() {
    let marker = tmp("record-ran");
    let _ = std::fs::remove_file(&marker);
    let touch = ["--", "touch", marker.to_str().unwrap()];
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec!["record", "-o", "/nonexistent-alloctrace-dir/run.atrace"],
            "cannot write the trace /nonexistent-alloctrace-dir/run.atrace",
        ),
        (
            vec!["record", "-o", "run.atrace", "--conf", "expandable_segment:True"],
            "did you mean `expandable_segments`?",
        ),
        (
            vec!["record", "-o", "run.atrace", "--conf", "per_process_memory_fraction:1.5"],
            "per_process_memory_fraction must be in [0, 1]",
        ),
    ];
    for (mut args, needle) in cases {
        args.extend(touch);
        let o = run(&args);
        assert_error(&o, needle);
        assert!(!marker.exists(), "the program ran: {args:?}");
    }
    // Without --conf the recorder takes PYTORCH_CUDA_ALLOC_CONF: it is checked the same way.
    let o = bin()
        .args(["record", "-o", "run.atrace", "--", "touch", marker.to_str().unwrap()])
        .env("PYTORCH_CUDA_ALLOC_CONF", "garbage_colection_threshold:0.5")
        .output()
        .unwrap();
    assert_error(&o, "PYTORCH_CUDA_ALLOC_CONF=garbage_colection_threshold:0.5");
    assert!(stderr(&o).contains("did you mean `garbage_collection_threshold`?"), "{}", stderr(&o));
    assert!(!marker.exists());
    // PyTorch 2.9 and later also read PYTORCH_ALLOC_CONF (first, for most keys): checked too.
    let o = bin()
        .args(["record", "-o", "run.atrace", "--", "touch", marker.to_str().unwrap()])
        .env("PYTORCH_ALLOC_CONF", "expandable_segment:True")
        .env("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
        .output()
        .unwrap();
    assert_error(&o, "PYTORCH_ALLOC_CONF=expandable_segment:True");
    assert!(!marker.exists());
    // Settings inherited as ALLOCTRACE_* are checked as the flags are.
    for (name, value, needle) in [
        ("ALLOCTRACE_CONF", "expandable_segment:True", "ALLOCTRACE_CONF=expandable_segment:True"),
        ("ALLOCTRACE_CAPACITY", "0", "ALLOCTRACE_CAPACITY=0: a 0-byte limit fits nothing"),
        ("ALLOCTRACE_CAPACITY", "lots", "ALLOCTRACE_CAPACITY=lots"),
    ] {
        let o = bin()
            .args(["record", "-o", "run.atrace", "--", "touch", marker.to_str().unwrap()])
            .env(name, value)
            .output()
            .unwrap();
        assert_error(&o, needle);
        assert!(!marker.exists(), "{name}={value}: the program ran");
    }
    assert!(!Path::new("run.atrace").exists());
}

/// Usage errors name what is missing or wrong and the subcommand whose `--help` explains it.
#[test]
fn usage_errors_name_the_arguments_and_the_subcommand_help() {
    let o = run(&["import", "torch"]);
    assert_error(&o, "not provided: --output <OUTPUT>, <SNAPSHOT>");
    assert!(stderr(&o).contains("(see `alloctrace import --help`)"), "{}", stderr(&o));
    let o = run(&["plot", "--kind", "pie", "x.atrace"]);
    assert_error(&o, "[possible values: timeline, segments, whatif, frag]");
    assert!(stderr(&o).contains("(see `alloctrace plot --help`)"), "{}", stderr(&o));
    let o = run(&["replay", "x.atrace", "--conf", "bogus:1"]);
    assert_error(&o, "`bogus` is not an allocator setting");
}

/// An error's cause is said once, however many layers pass it on.
#[test]
fn error_causes_are_not_repeated() {
    let dir = std::env::temp_dir();
    let cut = tmp("cut-once.pickle");
    let pickle = root().join("../shared/traces/torch/leak_list_append.default.pickle");
    let snapshot = std::fs::read(&pickle).ok();
    if let Some(bytes) = &snapshot {
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    }
    let t = trace("seed_experiments.default");
    let mut cases = vec![
        (vec!["import", "torch", "/nonexistent/snap.pickle", "-o", "x.atrace"], "No such file"),
        (vec!["replay", t.to_str().unwrap(), "-o", dir.to_str().unwrap()], "is a folder"),
    ];
    if snapshot.is_some() {
        cases.push((vec!["import", "torch", cut.to_str().unwrap(), "-o", "x.atrace"], "truncated pickle"));
    }
    for (args, cause) in cases {
        let o = run(&args);
        assert_error(&o, cause);
        assert_eq!(stderr(&o).matches(cause).count(), 1, "{args:?}: {}", stderr(&o));
    }
}

/// Every command that reads a trace analyzes a damaged one up to the damage, says where the
/// damage is, and exits 3: a cut inside a later frame, and a cut inside the first (no events).
#[test]
fn every_command_reports_damage_and_exits_3() {
    let whole = trace("recorded_rust_workload");
    let bytes = std::fs::read(&whole).unwrap();
    let cases = [("cut-late.atrace", bytes.len() * 2 / 3), ("cut-early.atrace", 1000)];
    for (name, keep) in cases {
        let f = tmp(name);
        std::fs::write(&f, &bytes[..keep]).unwrap();
        let (f, w) = (f.to_str().unwrap(), whole.to_str().unwrap());
        let svg = tmp("damaged.svg");
        let dir = tmp("damaged-report");
        let commands: Vec<Vec<&str>> = vec![
            vec!["summary", f],
            vec!["dump", f],
            vec!["replay", f],
            vec!["whatif", f, "--no-search"],
            vec!["explain", f],
            vec!["leaks", f],
            vec!["frag", f],
            vec!["plot", f, "-o", svg.to_str().unwrap()],
            vec!["report", f, "-o", dir.to_str().unwrap()],
            vec!["diff", f, w],
        ];
        for args in commands {
            let o = run(&args);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(3), "{args:?}: {e}");
            assert!(e.contains(name) && e.contains("truncated at byte"), "{args:?}: {e}");
        }
    }
}

/// A snapshot imported without its limit, which ran out of memory while the device had tens of
/// GiB free: a limit below the device was in force. The replay assumes the least it can have
/// been, reproduces the OOM, and `explain` says the limit is inferred and how to give it.
#[test]
fn a_limit_left_out_on_import_is_inferred_and_said_to_be() {
    let pickle = root().join("../shared/traces/torch/frag_oom.default.pickle");
    if !pickle.exists() {
        eprintln!("skipped: {} is not here", pickle.display());
        return;
    }
    let out = tmp("nocap.atrace");
    let o = run(&["import", "torch", pickle.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["replay", "--json", out.to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["capacity_source"], "inferred_limit");
    assert_eq!(j["outcome"], "oom");
    assert_eq!(j["oom_event"], 1012, "the recorded OOM");
    let o = run(&["explain", out.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("note: no limit was recorded") && text.contains("--capacity"), "{text}");
    assert!(!text.contains("allowed;"), "PyTorch's message names no limit that was not recorded: {text}");
}

/// With the limit unknown, `explain` gives the verdict at every limit the trace allows, in
/// ranges, and above them; each range's verdict is the one `explain` gives when told a limit
/// inside it (`--capacity`, which replays there).
#[test]
fn an_unknown_limit_gives_the_verdict_over_the_range_of_limits() {
    let pickle = root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let out = tmp("nocap-range.atrace");
    let o = run(&["import", "torch", pickle.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let t = out.to_str().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&run(&["explain", "--json", t]).stdout).unwrap();
    assert_eq!(j["capacity_source"], "inferred_limit");
    let ranges = j["verdict_by_limit"].as_array().expect("a verdict per range of limits");
    let kinds: Vec<&str> = ranges.iter().map(|r| r["kind"].as_str().unwrap_or("served")).collect();
    assert_eq!(kinds, ["true_exhaustion", "fragmentation", "served"], "{ranges:?}");
    let last = ranges.last().unwrap();
    assert!(last["to_bytes"].is_null());
    // Each range's verdict is explain's at limits inside it: on frag_oom's import, and on a
    // Hugging Face Trainer's snapshot whose real limit (4.76 GiB, in its name) lies where
    // fragmentation begins 1.4 MB above where live bytes plus the request reach the limit
    // (explain said "true exhaustion at any limit from 4.51 GiB to under 4.90 GiB", and
    // "fragmentation" when told the real limit).
    let hf = root().join("tests/fixtures/doctor/hf_trainer.5116002304.pickle");
    let hf = hf.to_str().unwrap();
    for (t, real) in [(t, None), (hf, Some(5116002304u64))] {
        let j: serde_json::Value = serde_json::from_slice(&run(&["explain", "--json", t]).stdout).unwrap();
        let ranges = j["verdict_by_limit"].as_array().expect("a verdict per range of limits");
        let bounded = &ranges[..ranges.len() - 1];
        let mut limits: Vec<(u64, &serde_json::Value)> = Vec::new();
        for r in bounded {
            let (from, to) = (r["from_bytes"].as_u64().unwrap(), r["to_bytes"].as_u64().unwrap());
            limits.extend([from, (from + to) / 2, to - 1].map(|l| (l, &r["kind"])));
        }
        if let Some(real) = real {
            let r =
                bounded.iter().find(|r| r["from_bytes"].as_u64() <= Some(real) && Some(real) < r["to_bytes"].as_u64());
            limits.push((real, &r.expect("the real limit is in the range the snapshot allows")["kind"]));
        }
        for (limit, kind) in limits {
            let cap = limit.to_string();
            let o = run(&["explain", "--json", t, "--capacity", &cap]);
            let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(&e["verdict"]["kind"], kind, "{t} at {limit}");
            assert!(e["verdict_by_limit"].is_null(), "a given limit is known");
        }
    }
    // Above the range, the failed request is served.
    let cap = last["from_bytes"].as_u64().unwrap().to_string();
    let r: serde_json::Value =
        serde_json::from_slice(&run(&["replay", "--json", t, "--capacity", &cap]).stdout).unwrap();
    assert_eq!(r["reach"], "gets_past_failure");
    // Where an earlier OOM the program caught (a cuDNN workspace) set the range, the request that
    // failed needs more than its top: explain said "at 1.13 GiB or above the failed request gets
    // its segment" on amp_adamw, where the replay at 1.13 GiB fails at that request.
    let amp = root().join("tests/fixtures/truth/amp_adamw.default.1.00.pickle");
    let amp = amp.to_str().unwrap();
    let e: serde_json::Value = serde_json::from_slice(&run(&["explain", "--json", amp]).stdout).unwrap();
    let from = e["verdict_by_limit"].as_array().unwrap().last().unwrap()["from_bytes"].as_u64().unwrap();
    let replayed = |cap: u64| -> serde_json::Value {
        serde_json::from_slice(&run(&["replay", "--json", amp, "--capacity", &cap.to_string()]).stdout).unwrap()
    };
    assert_eq!(replayed(from)["reach"], "gets_past_failure", "at {from}");
    assert_eq!(replayed(from - 1)["oom_event"], e["figures"]["event"], "below {from}");
    // The terminal text is wrapped: compare with its whitespace folded.
    let text = String::from_utf8_lossy(&run(&["explain", t]).stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        text.contains(
            "true exhaustion at any limit from 1.80 GiB to under 1.90 GiB; fragmentation at any limit from 1.90 GiB"
        ),
        "{text}"
    );
}

/// Every min capacity `whatif` reports is a limit at which `replay` of that policy completes
/// (for expandable segments the unlimited run's peak reserved is not such a limit here).
#[test]
fn whatif_min_capacities_replay_to_completion() {
    let t = trace("frag_oom.default");
    let t = t.to_str().unwrap();
    let o = run(&["whatif", "--json", t]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = w["rows"].as_array().unwrap();
    assert!(rows.len() >= 6);
    for row in rows {
        let (conf, min) = (row["alloc_conf"].as_str().unwrap(), row["min_capacity_bytes"].as_u64().unwrap());
        let cap = min.to_string();
        let mut args = vec!["replay", "--json", t, "--capacity", cap.as_str()];
        if !conf.is_empty() {
            args.extend(["--conf", conf]);
        }
        let r: serde_json::Value = serde_json::from_slice(&run(&args).stdout).unwrap();
        assert_eq!(r["outcome"], "ok", "{conf} at its min capacity {min}");
    }
}

/// Outputs never destroy inputs: an output that is the input (by name, symlink or hard link) is
/// refused with exit 2 and the input is left as it was.
#[test]
fn an_output_that_is_the_input_is_refused() {
    let dir = tmp("same-file");
    std::fs::create_dir_all(&dir).unwrap();
    let pickle = dir.join("s.pickle");
    std::fs::copy(root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle"), &pickle).unwrap();
    let t = dir.join("t.atrace");
    std::fs::copy(trace("frag_oom.default"), &t).unwrap();
    let before = (std::fs::read(&pickle).unwrap(), std::fs::read(&t).unwrap());
    let link = dir.join("link.atrace");
    let hard = dir.join("hard.atrace");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&t, &link).unwrap();
    std::fs::hard_link(&t, &hard).unwrap();
    let (p, ts) = (pickle.to_str().unwrap(), t.to_str().unwrap());
    assert_error(&run(&["import", "torch", p, "-o", p]), "the output is the input");
    assert_error(&run(&["replay", ts, "-o", ts]), "the output is the input");
    #[cfg(unix)]
    assert_error(&run(&["replay", ts, "-o", link.to_str().unwrap()]), "the output is the input");
    assert_error(&run(&["replay", ts, "-o", hard.to_str().unwrap()]), "the output is the input");
    assert_error(&run(&["plot", ts, "-o", ts]), "the output is the input");
    for format in ["perfetto", "memory-viz"] {
        assert_error(&run(&["export", ts, "--format", format, "-o", ts]), "the output is the input");
        #[cfg(unix)]
        assert_error(
            &run(&["export", ts, "--format", format, "-o", link.to_str().unwrap()]),
            "the output is the input",
        );
    }
    let other = dir.join("other.atrace");
    std::fs::copy(trace("seed_experiments.default"), &other).unwrap();
    let os = other.to_str().unwrap();
    assert_error(&run(&["ranks", ts, os, "-o", ts]), "the output is the input");
    assert_error(&run(&["ranks", ts, os, "-o", hard.to_str().unwrap()]), "the output is the input");
    assert_eq!((std::fs::read(&pickle).unwrap(), std::fs::read(&t).unwrap()), before, "inputs untouched");
    // The report refuses to write over its trace inside the folder.
    let rdir = dir.join("r");
    std::fs::create_dir_all(&rdir).unwrap();
    let inside = rdir.join("summary.json");
    std::fs::copy(&t, &inside).unwrap();
    assert_error(&run(&["report", inside.to_str().unwrap(), "-o", rdir.to_str().unwrap()]), "the output is the input");
    std::fs::remove_dir_all(&dir).ok();
}

/// `report -o DIR` writes into a new, empty or previous-report folder; another folder needs --force.
#[test]
fn report_refuses_a_folder_that_is_not_a_report() {
    let dir = tmp("report-dir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let t = trace("seed_experiments.default");
    let (ts, ds) = (t.to_str().unwrap(), dir.to_str().unwrap());
    assert_error(&run(&["report", ts, "-o", ds]), "--force");
    assert!(!dir.join("report.md").exists());
    let o = run(&["report", ts, "-o", ds, "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "mine");
    // A previous report is replaced without --force, and no temporary file is left behind.
    std::fs::remove_file(dir.join("notes.txt")).unwrap();
    let o = run(&["report", ts, "-o", ds]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // A folder holding only files with a report's names is not taken for a report: the user's
    // summary.json is kept unless --force.
    let mine = tmp("report-dir-mine");
    let _ = std::fs::remove_dir_all(&mine);
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("summary.json"), "{\"accuracy\": 0.93}\n").unwrap();
    assert_error(&run(&["report", ts, "-o", mine.to_str().unwrap()]), "--force");
    assert_eq!(std::fs::read_to_string(mine.join("summary.json")).unwrap(), "{\"accuracy\": 0.93}\n");
    assert!(!mine.join("report.md").exists());
    std::fs::remove_file(mine.join("summary.json")).unwrap();
    std::fs::write(mine.join("timeline.svg"), "<svg/>").unwrap();
    assert_error(&run(&["report", ts, "-o", mine.to_str().unwrap()]), "--force");
    assert_eq!(std::fs::read_to_string(mine.join("timeline.svg")).unwrap(), "<svg/>");
    std::fs::remove_dir_all(&mine).ok();
    std::fs::remove_dir_all(&dir).ok();
}

/// The files `export` and `ranks -o` write appear whole or not at all: an existing output is
/// replaced through a rename (a new inode), and no temporary file is left beside it.
#[test]
fn export_and_ranks_replace_their_output_by_a_rename() {
    let dir = tmp("atomic-outputs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (t, u) = (trace("frag_oom.default"), trace("seed_experiments.default"));
    let (ts, us) = (t.to_str().unwrap(), u.to_str().unwrap());
    // Each over an earlier output of its kind, made by the same command of another trace (a
    // file of another kind is refused: `exports_never_replace_a_users_file`).
    for (name, args, earlier) in [
        ("p.json", vec!["export", ts, "--format", "perfetto"], vec!["export", us, "--format", "perfetto"]),
        ("m.pickle", vec!["export", ts, "--format", "memory-viz"], vec!["export", us, "--format", "memory-viz"]),
        ("r.svg", vec!["ranks", ts, us], vec!["ranks", us, ts]),
    ] {
        let out = dir.join(name);
        let with_out = |args: &[&str]| {
            let mut args = args.to_vec();
            args.extend(["-o", out.to_str().unwrap()]);
            let o = run(&args);
            assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        };
        with_out(&earlier);
        let old = std::fs::read(&out).unwrap();
        let keep = dir.join(format!("{name}.link"));
        std::fs::hard_link(&out, &keep).unwrap();
        with_out(&args);
        assert_eq!(std::fs::read(&keep).unwrap(), old, "{name}: written in place");
        assert_ne!(std::fs::read(&out).unwrap(), old, "{name}: not replaced");
    }
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// An export never replaces what a user keeps at its path: a PyTorch snapshot (the evidence of
/// the OOM being debugged), another tool's JSON, or a read-only file, even of its own kind.
#[test]
fn exports_never_replace_a_users_file() {
    let dir = tmp("exports-keep");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let t = trace("frag_oom.default");
    let ts = t.to_str().unwrap();
    let snapshot = root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let users: [(&str, Vec<u8>, &str); 3] = [
        ("snap.pickle", std::fs::read(&snapshot).unwrap(), "memory-viz"),
        ("other.json", b"{\"a\": 1}\n".to_vec(), "perfetto"),
        ("other.pickle", b"\x80\x04K\x01.".to_vec(), "memory-viz"),
    ];
    for (name, content, format) in users {
        let out = dir.join(name);
        std::fs::write(&out, &content).unwrap();
        let o = run(&["export", ts, "--format", format, "-o", out.to_str().unwrap()]);
        assert_error(&o, "alloctrace replaces only its own outputs");
        assert_eq!(std::fs::read(&out).unwrap(), content, "{name}");
    }
    // A read-only earlier export is kept too.
    let out = dir.join("ro.json");
    let o = run(&["export", ts, "--format", "perfetto", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let before = std::fs::read(&out).unwrap();
    let mut perms = std::fs::metadata(&out).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&out, perms).unwrap();
    let u = trace("seed_experiments.default");
    assert_error(
        &run(&["export", u.to_str().unwrap(), "--format", "perfetto", "-o", out.to_str().unwrap()]),
        "read-only",
    );
    assert_eq!(std::fs::read(&out).unwrap(), before);
    std::fs::remove_dir_all(&dir).ok();
}

/// A symlink planted at an output path inside the report folder is replaced, not written through.
#[cfg(unix)]
#[test]
fn report_does_not_write_through_a_planted_symlink() {
    let dir = tmp("report-symlink");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("r")).unwrap();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep").unwrap();
    std::fs::write(dir.join("r/summary.json"), "{}").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("r/report.md")).unwrap();
    // The folder holds no earlier report (its summary.json is not a report's): --force.
    let r = dir.join("r");
    let o = run(&["report", trace("seed_experiments.default").to_str().unwrap(), "-o", r.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(!std::fs::symlink_metadata(dir.join("r/report.md")).unwrap().file_type().is_symlink());
    std::fs::remove_dir_all(&dir).ok();
}

/// A limit given on the command line is reported as given, by every command that uses one,
/// for an .atrace as for a snapshot imported on the fly (it was reported as recorded).
#[test]
fn a_given_capacity_is_reported_as_given() {
    let t = trace("frag_oom.default");
    let t = t.to_str().unwrap();
    let snapshot = root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let snapshot = snapshot.to_str().unwrap();
    for input in [t, snapshot] {
        for cmd in ["explain", "whatif", "frag"] {
            let mut args = vec![cmd, input, "--capacity", "3GiB", "--json"];
            if cmd == "whatif" {
                args.push("--no-search");
            }
            let o = run(&args);
            assert!(o.status.success(), "{cmd} {input}: {}", stderr(&o));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["capacity_bytes"], 3u64 << 30, "{cmd} {input}");
            assert_eq!(v["capacity_source"], "given", "{cmd} {input}");
        }
    }
}

/// Every command that reads a snapshot takes `--device`, as its warning says: a snapshot of
/// two devices (`fixtures/two_devices.pickle`: device 0 is `torch/seed_experiments.default`'s
/// history, device 1 `torch/leak_list_append.default`'s, their segments tagged with the
/// device) reads device 1 where asked, and a trace refuses it.
#[test]
fn every_command_reading_a_snapshot_takes_device() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two_devices.pickle");
    let p = p.to_str().unwrap();
    let events = |device: &str| -> u64 {
        let o = run(&["summary", "--json", p, "--device", device]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["events"].as_u64().unwrap()
    };
    assert_eq!((events("0"), events("1")), (26, 1010));
    let warning = stderr(&run(&["summary", p]));
    assert!(warning.contains("--device N picks another"), "{warning}");
    let out = tmp("two_devices");
    std::fs::create_dir_all(&out).unwrap();
    let o = |name: &str| out.join(name).to_str().unwrap().to_string();
    let commands: Vec<Vec<String>> = vec![
        vec!["replay".into(), p.into()],
        vec!["dump".into(), p.into()],
        vec!["leaks".into(), p.into()],
        vec!["whatif".into(), "--no-search".into(), p.into()],
        vec!["explain".into(), p.into()],
        vec!["frag".into(), p.into()],
        vec!["plot".into(), p.into(), "-o".into(), o("t.svg")],
        vec!["export".into(), p.into(), "--format".into(), "perfetto".into(), "-o".into(), o("t.json")],
        vec!["diff".into(), p.into(), p.into()],
        vec!["report".into(), p.into(), "-o".into(), o("report")],
    ];
    for c in commands {
        let mut args: Vec<&str> = c.iter().map(String::as_str).collect();
        args.extend(["--device", "1"]);
        let r = run(&args);
        assert_eq!(r.status.code(), Some(0), "{args:?}: {}", stderr(&r));
        // Device 1 was read: the warning names device 0 as the other one.
        assert!(stderr(&r).contains("history of device 0"), "{args:?}: {}", stderr(&r));
    }
    assert_error(&run(&["dump", trace("gpt2_train.default").to_str().unwrap(), "--device", "1"]), "--device");
}

/// `plot` replays under the run's facts as `frag` does: the segment map at the OOM under a given
/// limit, and at the peak under given settings, is taken at `frag`'s moment.
#[test]
fn plot_replays_under_the_given_limit_and_settings() {
    let t = trace("gpt2_train.default");
    let t = t.to_str().unwrap();
    let svg = tmp("plot_facts.svg");
    let svg = svg.to_str().unwrap();
    let json = |args: &[&str]| json_of(args, 0);
    // The whole trace completes under its own limit: there is no OOM to draw.
    let o = run(&["plot", t, "--kind", "segments", "--at", "oom", "-o", svg]);
    assert_ne!(o.status.code(), Some(0));
    // At 5.5 GiB the replay runs out of memory; the map is drawn after that event.
    let frag = json(&["frag", t, "--capacity", "5.5GiB", "--json"]);
    let oom = frag["oom_event"].as_u64().expect("frag runs out of memory at 5.5 GiB");
    let drawn = json(&["plot", t, "--kind", "segments", "--at", "oom", "--capacity", "5.5GiB", "-o", svg, "--json"]);
    assert_eq!(drawn["events"].as_u64(), Some(oom + 1));
    // Under another setting the peak moves, and the map follows it.
    for conf in ["max_split_size_mb:64", "expandable_segments:True"] {
        let frag = json(&["frag", t, "--at", "peak", "--conf", conf, "--json"]);
        let drawn = json(&["plot", t, "--kind", "segments", "--conf", conf, "-o", svg, "--json"]);
        assert_eq!(drawn["events"].as_u64(), frag["moment"]["event"].as_u64().map(|e| e + 1), "{conf}");
    }
    let default = json(&["plot", t, "--kind", "segments", "-o", svg, "--json"]);
    let split = json(&["plot", t, "--kind", "segments", "--conf", "max_split_size_mb:64", "-o", svg, "--json"]);
    assert_ne!(default["events"], split["events"], "the setting changes the peak on this trace");
}

/// Text fits a screen: on every shipped trace, the text of summary, replay, whatif, frag, leaks
/// and explain (also `--verbose`, and on a snapshot with 164 recorded OOMs, which it listed on one
/// line of 3,908 columns) keeps every line within 100 columns, but for a single word longer than
/// that (a URL), which stands alone; no line ends in a space.
#[test]
fn text_output_fits_a_screen() {
    let mut traces: Vec<PathBuf> = std::fs::read_dir(root().join("traces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "atrace"))
        .collect();
    traces.sort();
    traces.push(root().join("tests/fixtures/truth/amp_adamw.default.1.00.pickle"));
    for t in &traces {
        for cmd in ["summary", "replay", "whatif", "frag", "leaks", "explain", "explain --verbose"] {
            let args: Vec<&str> = match cmd {
                "whatif" => vec![cmd, "--no-search", t.to_str().unwrap()],
                "explain --verbose" => vec!["explain", "--verbose", t.to_str().unwrap()],
                _ => vec![cmd, t.to_str().unwrap()],
            };
            let o = run(&args);
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let one_word = !line.trim().contains(' ');
                assert!(line.chars().count() <= 100 || one_word, "{args:?}: {} columns: {line}", line.chars().count());
                assert!(!line.ends_with(' '), "{args:?}: a line ends in a space: {line:?}");
            }
        }
    }
    // The commands of two inputs, and those that write a file.
    let out = tmp("screen");
    std::fs::create_dir_all(&out).unwrap();
    let o = |name: &str| out.join(name).to_str().unwrap().to_string();
    let ranks = root().join("analyzer/tests/fixtures/ranks");
    let (r0, r1) = (ranks.join("ddp_rank0.pickle"), ranks.join("ddp_rank1.pickle"));
    let (a, b) = (trace("gpt2_train.default"), trace("recorded_gpt2_train"));
    let commands: Vec<Vec<String>> = vec![
        vec!["ranks".into(), r0.display().to_string(), r1.display().to_string()],
        vec!["diff".into(), a.display().to_string(), b.display().to_string()],
        vec!["export".into(), a.display().to_string(), "--format".into(), "perfetto".into(), "-o".into(), o("t.json")],
        vec![
            "export".into(),
            a.display().to_string(),
            "--format".into(),
            "memory-viz".into(),
            "-o".into(),
            o("t.pickle"),
        ],
        vec!["synth".into(), "--events".into(), "2000".into(), "-o".into(), o("s.atrace")],
    ];
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run(&args);
        assert_eq!(r.status.code(), Some(0), "{args:?}: {}", stderr(&r));
        for line in String::from_utf8_lossy(&r.stdout).lines() {
            let one_word = !line.trim().contains(' ');
            assert!(line.chars().count() <= 100 || one_word, "{args:?}: {} columns: {line}", line.chars().count());
        }
    }
}

/// `ranks` says where it numbered the ranks by position: two files that name the same rank.
#[test]
fn ranks_says_when_it_numbers_by_position() {
    let r0 = root().join("analyzer/tests/fixtures/ranks/ddp_rank0.pickle");
    let r0 = r0.to_str().unwrap();
    let o = run(&["ranks", r0, r0]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ranks by position on the command line"));
    // The same file twice is said to be one rank compared with itself.
    assert!(stderr(&o).contains("given more than once"), "{}", stderr(&o));
    let r1 = root().join("analyzer/tests/fixtures/ranks/ddp_rank1.pickle");
    let o = run(&["ranks", r0, r1.to_str().unwrap()]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("ranks by position"));
}

/// With `--json`, an input with nothing to analyse (a trace damaged before its first request)
/// gives JSON saying so, not a line of text, and exit code 3 for the damage.
#[test]
fn nothing_to_analyse_is_json_under_json() {
    let bytes = std::fs::read(trace("gpt2_train.default")).unwrap();
    let f = tmp("headless.atrace");
    std::fs::write(&f, &bytes[..bytes.len().min(600)]).unwrap();
    let f = f.to_str().unwrap();
    let report = tmp("headless_report");
    for args in [
        vec!["whatif", f, "--json"],
        vec!["explain", f, "--json"],
        vec!["frag", f, "--json"],
        vec!["report", f, "--json", "-o", report.to_str().unwrap()],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(j["nothing_to_analyse"].as_str().is_some_and(|w| w.contains("nothing to analyse")), "{j}");
        assert!(j["input_damage"].as_str().is_some_and(|d| d.contains("byte")), "{j}");
    }
}

/// Options that would silently mean something else are refused: a fraction of a byte (`1.5`
/// was read as 2 bytes) and a release whose allocator the engine does not follow (`1.0` was
/// replayed and labelled "1.0's allocator").
#[test]
fn fractional_bytes_and_releases_not_followed_are_refused() {
    let t = trace("gpt2_train.default");
    let t = t.to_str().unwrap();
    assert_error(&run(&["replay", t, "--capacity", "1.5"]), "whole");
    assert_error(&run(&["replay", t, "--torch-version", "1.0"]), "2.9 to 2.13");
    assert_error(&run(&["whatif", t, "--torch-version", "9.9"]), "2.9 to 2.13");
    for ok in [vec!["replay", t, "--capacity", "1.5GiB"], vec!["replay", t, "--torch-version", "2.13.0+cu130"]] {
        let o = run(&ok);
        assert_eq!(o.status.code(), Some(0), "{ok:?}: {}", stderr(&o));
    }
}

/// Nothing of the user's is overwritten: an output path holding a file of another kind (notes
/// given as `-o`) is refused, with the file left as it was; the command's own earlier output
/// is replaced.
#[test]
fn a_file_of_another_kind_at_an_output_path_is_left_alone() {
    let t = trace("gpt2_train.default");
    let t = t.to_str().unwrap();
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch/seed_experiments.default.pickle");
    // Notes under a name the command writes (a picture's is .svg or .png).
    let (notes, drawing) = (tmp("notes.txt"), tmp("notes.svg"));
    let (n, d) = (notes.to_str().unwrap(), drawing.to_str().unwrap());
    let commands: Vec<Vec<&str>> = vec![
        vec!["import", "torch", snapshot.to_str().unwrap(), "-o", n],
        vec!["replay", t, "-o", n],
        vec!["synth", "--events", "1000", "-o", n],
        vec!["plot", t, "-o", d],
        vec!["export", t, "--format", "perfetto", "-o", n],
        vec!["export", t, "--format", "memory-viz", "-o", n],
        vec!["ranks", t, t, "-o", d],
    ];
    for args in &commands {
        let notes = Path::new(args.last().unwrap());
        std::fs::write(notes, "my notes\n").unwrap();
        assert_error(&run(args), "is not");
        assert_eq!(std::fs::read_to_string(notes).unwrap(), "my notes\n", "{args:?}");
    }
    // Each command's earlier output is replaced.
    for args in &commands {
        std::fs::remove_file(args.last().unwrap()).ok();
        for _ in 0..2 {
            let o = run(args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        }
    }
}

/// `diff`'s table keeps its columns: each figure ends under its column's heading, the replayed
/// outcome ("oom at event 1012", wider than a byte figure) included.
#[test]
fn diff_columns_end_under_their_headings() {
    let (a, b) = (trace("frag_oom.default"), trace("gpt2_train.default"));
    let o = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let head =
        lines.iter().position(|l| l.trim_start().starts_with("A ") && l.ends_with("B - A")).expect("the heading");
    let ends: Vec<usize> = ["A", "B"].iter().map(|h| lines[head].find(&format!(" {h} ")).unwrap() + 2).collect();
    let rows = &lines[head + 1..head + 9];
    assert!(rows.iter().any(|l| l.starts_with("outcome (replayed)") && l.contains("oom at event 1012")), "{text}");
    for row in rows {
        for &end in &ends {
            assert!(row.is_char_boundary(end) && row.len() >= end, "{row}");
            let (left, right) = row.split_at(end);
            assert!(
                !left.ends_with(' ') && (right.is_empty() || right.starts_with(' ')),
                "a figure does not end at column {end}: {row}\n{text}"
            );
        }
    }
}

/// In `whatif` at a capacity, the peak column is the run under that capacity: no row, the
/// no-caching row included, shows a peak above the capacity (a run that fails there shows its
/// peak up to the failure, or none; its need is the min capacity).
#[test]
fn whatif_shows_no_peak_above_the_capacity_compared() {
    let bytes = |s: &str| -> Option<f64> {
        let (n, unit) = s.trim().split_once(' ')?;
        let scale = match unit {
            "B" => 1.0,
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            _ => return None,
        };
        Some(n.parse::<f64>().ok()? * scale)
    };
    for (name, cap, gib) in [("recorded_bert_infer_varlen", "1GiB", 1.0), ("gpt2_train.default", "5.5GiB", 5.5)] {
        let t = trace(name);
        let o = run(&["whatif", "--no-search", t.to_str().unwrap(), "--capacity", cap]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = String::from_utf8(o.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let head = lines.iter().position(|l| l.starts_with("policy")).expect("the table");
        let end = lines[head].find("peak rsvd").unwrap() + "peak rsvd".len();
        let rows: Vec<&str> = lines[head + 1..].iter().take_while(|l| !l.starts_with("what the")).copied().collect();
        assert!(rows.iter().any(|r| r.starts_with("no caching")), "{text}");
        for row in rows {
            let cell = &row[end - 11..end];
            if let Some(b) = bytes(cell) {
                assert!(b <= gib * (1u64 << 30) as f64, "{name} at {cap}: {row}");
            } else {
                assert_eq!(cell.trim(), "-", "{row}");
            }
        }
    }
}

/// Outputs are files like any other: as readable as the umask lets `File::create` make a file,
/// not private as the temporary file they are written through.
#[cfg(unix)]
#[test]
fn outputs_are_as_readable_as_the_umask_allows() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp("modes");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let plain = dir.join("plain");
    std::fs::File::create(&plain).unwrap();
    let t = trace("frag_oom.default");
    let t = t.to_str().unwrap();
    let o = |name: &str| dir.join(name).to_str().unwrap().to_string();
    for args in [
        vec!["plot", t, "-o", &o("t.svg")],
        vec!["export", t, "--format", "perfetto", "-o", &o("t.json")],
        vec!["report", t, "--no-search", "-o", &o("report")],
    ] {
        let r = run(&args);
        assert_eq!(r.status.code(), Some(0), "{args:?}: {}", stderr(&r));
    }
    for written in [dir.join("t.svg"), dir.join("t.json"), dir.join("report/report.md")] {
        assert_eq!(mode(&written), mode(&plain), "{}", written.display());
    }
}

/// Under `roundup_power2_divisions`, live blocks hold more than the program asked for. On
/// `gpt2_train` at 5.5 GiB with divisions of 4, the rounded live bytes plus the request pass the
/// limit while what the program asked for does not: the verdict says the rounding adds the
/// difference, not that no allocator could serve it; the what-if table tries the settings
/// without the rounding (one division); and the no-caching row, each request a `cudaMalloc` of
/// its own size in PyTorch (`uncached_allocate`), is the same with or without the setting.
#[test]
fn power_of_two_rounding_is_named_and_tried_without() {
    let t = trace("gpt2_train.default");
    let t = t.to_str().unwrap();
    let json = |args: &[&str]| json_of(args, 0);
    let rounded = ["--capacity", "5.5GiB", "--conf", "roundup_power2_divisions:4", "--json"];
    let x = json(&[&["explain", t][..], &rounded[..]].concat());
    let reason = x["verdict"]["reason"].as_str().unwrap();
    let f = &x["figures"];
    let (live, asked, request) = (
        f["allocated_bytes"].as_u64().unwrap(),
        f["live_requested_bytes"].as_u64().unwrap(),
        f["requested_bytes"].as_u64().unwrap(),
    );
    let limit = 11 * (1u64 << 29);
    assert!(live + request > limit && asked + request <= limit, "the case the test is about: {f}");
    assert!(!reason.contains("no allocator could serve it"), "{reason}");
    assert!(reason.contains("the rounding of roundup_power2_divisions adds"), "{reason}");
    let w = json(&[&["whatif", "--no-search", t][..], &rounded[..]].concat());
    let policies: Vec<&str> = w["rows"].as_array().unwrap().iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert!(policies.contains(&"roundup_power2_divisions:1"), "{policies:?}");
    let plain = json(&["whatif", "--no-search", t, "--capacity", "5.5GiB", "--json"]);
    assert_eq!(w["bounds"]["no_caching_peak_bytes"], plain["bounds"]["no_caching_peak_bytes"]);
    // Without a power-of-two setting there is nothing to undo.
    let policies: Vec<&str> = plain["rows"].as_array().unwrap().iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert!(!policies.contains(&"roundup_power2_divisions:1"), "{policies:?}");
}

/// `diff` states each side's limit as the replay it compares ran under: `null` where there is
/// none, with its source, as `replay` does (an inferred one included).
#[test]
fn diff_states_each_sides_limit_as_replay_does() {
    let sides = [
        trace("gpt2_train.default"),
        trace("frag_oom.default"),
        root().join("tests/fixtures/doctor/hf_trainer.4732223488.pickle"),
    ];
    let json = |args: &[&str]| json_of(args, 0);
    for pair in [[0, 1], [2, 1]] {
        let (a, b) = (sides[pair[0]].to_str().unwrap(), sides[pair[1]].to_str().unwrap());
        let d = json(&["diff", a, b, "--json"]);
        for (side, path) in [("a", a), ("b", b)] {
            let r = json(&["replay", path, "--json"]);
            assert_eq!(d[side]["capacity_bytes"], r["capacity_bytes"], "{path}");
            assert_eq!(d[side]["capacity_source"], r["capacity_source"], "{path}");
        }
    }
}

/// The growth behind an OOM verdict is the growth that led to it: on a synthetic job leaking
/// 8 MiB an iteration, whose other live bytes rise by 56 MiB an iteration and drop every eighth
/// (`synth --fragment`), replayed under a limit it fails part way through, `explain` counts the
/// iterations before the failure only, and gives a growth near the 8 MiB trend, not the 56 MiB
/// rise.
#[test]
fn growth_behind_an_oom_is_the_trend_before_it() {
    let t = tmp("leaky.atrace");
    let t = t.to_str().unwrap();
    let o = run(&["synth", "--events", "60000", "--seed", "3", "--leak-bytes-per-iter", "8MiB", "--fragment", "-o", t]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["explain", t, "--capacity", "1GiB", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let x: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let oom = x["oom_event"].as_u64().expect("the job fails at 1 GiB");
    let g = &x["growth"];
    let bounds: Vec<u64> = g["boundaries"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
    assert!(bounds.len() >= 3 && bounds.iter().all(|&b| b <= oom), "{bounds:?} past {oom}");
    let per = g["per_iteration_bytes"].as_f64().unwrap() / (1u64 << 20) as f64;
    assert!((6.0..=14.0).contains(&per), "{per} MiB an iteration");
    let reason = x["verdict"]["reason"].as_str().unwrap();
    // Samples at the boundaries of N iterations measure N - 1 of them.
    assert!(reason.contains(&format!("over {} iterations", bounds.len() - 1)), "{reason}");
}

/// The shipped trace `name` exported as a memory-viz snapshot at the temporary path `out`.
fn exported_snapshot(name: &str, out: &str) -> PathBuf {
    let p = tmp(out);
    let _ = std::fs::remove_file(&p);
    let t = trace(name);
    let o = run(&["export", t.to_str().unwrap(), "--format", "memory-viz", "-o", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    p
}

/// A snapshot exported from a trace of no named release reads back as that: not as PyTorch
/// 2.13's, whose snapshots alone carry `trace_alloc_overflowed`.
#[test]
fn an_exported_snapshot_keeps_its_release() {
    let (t, p) = (trace("gpt2_train.default"), exported_snapshot("gpt2_train.default", "keeps_release.pickle"));
    let back = run(&["replay", p.to_str().unwrap(), "--json"]);
    assert_eq!(back.status.code(), Some(0), "{}", stderr(&back));
    let j: serde_json::Value = serde_json::from_slice(&back.stdout).unwrap();
    let orig: serde_json::Value =
        serde_json::from_slice(&run(&["replay", t.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(j["torch_version"], orig["torch_version"]);
    assert!(!stderr(&back).contains("2.13"), "{}", stderr(&back));
}

/// A what-if row that cannot tell says why, as the replay of its setting does.
#[test]
fn a_row_that_cannot_tell_says_why() {
    let p = root().join("tests/fixtures/doctor/lightning_resnet.1410334720.pickle");
    let p = p.to_str().unwrap();
    let json = |args: &[&str]| json_of(args, 0);
    let w = json(&["whatif", "--no-search", p, "--json"]);
    // At the table's limit: `--conf` says the run used that setting, and the limit inferred of
    // the snapshot is then the one under which that run replays as recorded.
    let cap = w["capacity_bytes"].as_u64().unwrap().to_string();
    let mut cannot = 0;
    for row in w["rows"].as_array().unwrap() {
        let conf = row["alloc_conf"].as_str().unwrap();
        let r = json(&["replay", p, "--conf", conf, "--capacity", &cap, "--json"]);
        assert_eq!(row["reach"], r["reach"], "{conf}");
        assert_eq!(row["failure_may_be_caught"], r["failure_may_be_caught"], "{conf}");
        if row["reach"] == "cannot_tell" {
            cannot += 1;
            assert!(row["failure_may_be_caught"].is_string(), "{conf}: {row}");
        }
    }
    assert!(cannot > 0, "the fixture has rows that cannot tell");
}

/// Unknown is null: a call site that was not recorded has its label, and `null` for its file,
/// line and function, never `""` and `0`.
#[test]
fn an_unrecorded_call_site_is_null_in_json() {
    let t = trace("frag_oom.default");
    let o = run(&["explain", t.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let x: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let site = &x["top_sites"][0]["site"];
    assert_eq!(site["label"], "(no call site recorded)", "{site}");
    for key in ["file", "line", "function"] {
        assert!(site[key].is_null(), "{key}: {site}");
    }
}

/// Every JSON output says where its input was damaged, as the analyses do: `diff` per side,
/// `ranks` per rank, `plot` for its picture.
#[test]
fn diff_ranks_and_plot_say_where_the_input_was_damaged() {
    let good = trace("gpt2_train.default");
    let bytes = std::fs::read(&good).unwrap();
    let cut = tmp("cut_for_json.atrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let (good, cut) = (good.to_str().unwrap(), cut.to_str().unwrap());
    let svg = tmp("cut_for_json.svg");
    let json = |args: &[&str]| json_of(args, 3);
    let damaged =
        |v: &serde_json::Value| v.as_str().is_some_and(|d| d.contains("cut_for_json.atrace") && d.contains("byte"));
    let d = json(&["diff", good, cut, "--json"]);
    assert!(d["a"]["input_damage"].is_null() && damaged(&d["b"]["input_damage"]), "{d}");
    let r = json(&["ranks", cut, "--json"]);
    assert!(damaged(&r["ranks"][0]["input_damage"]), "{r}");
    let p = json(&["plot", cut, "-o", svg.to_str().unwrap(), "--json"]);
    assert!(damaged(&p["input_damage"]), "{p}");
}

/// "The end" of a replay that runs out of memory is its failure, and `frag` and `plot` say so
/// (the trace itself goes on: `summary`'s end is another moment).
#[test]
fn the_end_of_a_failed_replay_is_named_as_such() {
    let t = trace("frag_oom.default");
    let t = t.to_str().unwrap();
    let o = run(&["frag", t, "--at", "end"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).replace("\n  ", " ");
    assert!(text.contains("at the end of the replay, which stops at its out-of-memory: event 1012"), "{text}");
    let svg = tmp("end_of_replay.svg");
    let o = run(&["plot", t, "--kind", "segments", "--at", "end", "-o", svg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("end of the replay, at its out-of-memory (event 1012)"));
    // A replay that completes ends where the trace does.
    let g = trace("gpt2_train.default");
    let o = run(&["frag", g.to_str().unwrap(), "--at", "end"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("at the end: event"));
}

/// Unknown is null: a trace that names no PyTorch release gives `torch_version: null`.
#[test]
fn an_unknown_release_is_null_in_summary() {
    let t = trace("gpt2_train.default");
    let s = json_of(&["summary", t.to_str().unwrap(), "--json"], 0);
    assert!(s["torch_version"].is_null(), "{}", s["torch_version"]);
}

/// Call sites have one shape everywhere: `diff` and `ranks` give them as objects with a label,
/// as `explain` and `leaks` do.
#[test]
fn diff_and_ranks_give_call_sites_in_the_one_shape() {
    let (a, b) = (trace("gpt2_train.default"), trace("recorded_gpt2_train"));
    let d = json_of(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json"], 0);
    let ranks = root().join("analyzer/tests/fixtures/ranks");
    let (r0, r1) = (ranks.join("ddp_rank0.pickle"), ranks.join("ddp_rank1.pickle"));
    let r = json_of(&["ranks", r0.to_str().unwrap(), r1.to_str().unwrap(), "--json"], 0);
    let sites: Vec<&serde_json::Value> = d["callsites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["callsite"])
        .chain(r["differing_sites"].as_array().unwrap().iter().map(|s| &s["site"]))
        .collect();
    assert!(sites.len() > 2);
    for s in sites {
        assert!(
            s["label"].is_string() && s.get("file").is_some() && s.get("line").is_some() && s.get("function").is_some(),
            "{s}"
        );
    }
}

/// A memory-viz export names the private pool of each segment live at its end, as PyTorch's
/// snapshot does (`segment_pool_id`): read back, the pool live at the end is a private pool with
/// the same bytes. (Pools freed before the end are not in a snapshot's segment list, PyTorch's
/// own included.)
#[test]
fn an_exported_snapshot_names_the_private_pools_live_at_its_end() {
    let (t, p) = (trace("recorded_graph_pools"), exported_snapshot("recorded_graph_pools", "pools_back.pickle"));
    let orig = json_of(&["summary", t.to_str().unwrap(), "--json"], 0);
    let back = json_of(&["summary", p.to_str().unwrap(), "--json"], 0);
    assert!(back["private_pools"].is_object(), "{}", back["private_pools"]);
    assert_eq!(back["private_pools"]["end_reserved_bytes"], orig["private_pools"]["end_reserved_bytes"]);
    let ids = orig["private_pools"]["pool_ids"].as_array().unwrap();
    for id in back["private_pools"]["pool_ids"].as_array().unwrap() {
        assert!(ids.contains(id), "{id} is not among {ids:?}");
    }
}

/// Without caching PyTorch does not apply its memory fraction (checked on an H100:
/// `tests/fixtures/gpt2_limits_h100.jsonl`): the no-caching row says so wherever its limit is, or
/// may be, a fraction, in the table's notes, the report's table and the report's OOM finding, and
/// says nothing where there is no limit.
#[test]
fn no_caching_row_says_a_memory_fraction_does_not_bound_it() {
    let frag = trace("frag_oom.default");
    let gpt2 = trace("gpt2_train.default");
    // frag_oom ran under a fraction (recorded): the note is certain.
    let w = json_of(&["whatif", frag.to_str().unwrap(), "--json"], 0);
    assert_eq!(w["no_caching"]["limit"], "ignored");
    assert_eq!(w["no_caching"]["reach"], "gets_past_failure");
    let o = run(&["whatif", frag.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("the limit of 2.00 GiB here, a memory fraction, does not bound the process"), "{text}");
    // A given limit may be a fraction or the device: the note says which case it is about.
    let w = json_of(&["whatif", gpt2.to_str().unwrap(), "--capacity", "5.5GiB", "--json"], 0);
    assert_eq!(w["no_caching"]["limit"], "ignored_if_fraction");
    let o = run(&["whatif", gpt2.to_str().unwrap(), "--capacity", "5.5GiB"]);
    let text = String::from_utf8_lossy(&o.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("where the limit of 5.50 GiB is a memory fraction"), "{text}");
    // No limit: nothing to say.
    let w = json_of(&["whatif", gpt2.to_str().unwrap(), "--no-search", "--json"], 0);
    assert_eq!(w["no_caching"]["limit"], "no_limit");
    let o = run(&["whatif", gpt2.to_str().unwrap(), "--no-search"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("does not bound the process"));
    // The report's OOM finding names no caching as what gets past, with the same caveat.
    let dir = tmp("no-caching-report");
    let _ = std::fs::remove_dir_all(&dir);
    let o = run(&["report", frag.to_str().unwrap(), "-o", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let md = md.split_whitespace().collect::<Vec<_>>().join(" ");
    let finding = md.split("Diagnosis:").nth(1).expect("the OOM finding");
    assert!(
        finding.contains(
            "no caching (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, a device call per request; PyTorch does not apply this \
limit, a memory fraction, without caching: see the what-if table)"
        ),
        "{finding}"
    );
    assert!(md.contains("No caching: PyTorch does not apply its memory fraction without caching"), "{md}");
}

/// `plot -o x.png` writes a PNG (it wrote the SVG under that name), rasterized as the report's
/// pictures are, and replaces only a PNG: notes named `x.png` by mistake are left alone.
#[test]
fn plot_to_a_png_name_writes_a_png() {
    let out = tmp("plot.png");
    std::fs::remove_file(&out).ok();
    let t = trace("frag_oom.default");
    let o = run(&["plot", t.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // Replaced again: it holds a PNG.
    assert_eq!(run(&["plot", t.to_str().unwrap(), "-o", out.to_str().unwrap()]).status.code(), Some(0));
    std::fs::write(&out, "my notes").unwrap();
    let o = run(&["plot", t.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "my notes");
    std::fs::remove_file(&out).ok();
    // A picture named for a format alloctrace does not draw is refused (an SVG went under x.pdf).
    let pdf = tmp("plot.pdf");
    assert_error(&run(&["plot", t.to_str().unwrap(), "-o", pdf.to_str().unwrap()]), "name the picture .svg or .png");
    assert!(!pdf.exists());
}

/// `report -o` names a folder: a file there is refused by name, and left as it was (the input
/// trace given as `-o` got a raw "File exists (os error 17)"); an output in a folder that does not
/// exist names the folder, not the temporary file written meanwhile.
#[test]
fn outputs_name_what_is_wrong_with_their_path() {
    let t = trace("frag_oom.default");
    let t = t.to_str().unwrap();
    let o = run(&["report", t, "-o", t]);
    assert_error(&o, "the output is the input");
    let notes = tmp("notes.txt");
    std::fs::write(&notes, "my notes").unwrap();
    let o = run(&["report", t, "-o", notes.to_str().unwrap()]);
    assert_error(&o, "is a file; a report is a folder of files");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes");
    let missing = tmp("no-such-folder").join("x.atrace");
    let snapshot = root().join("analyzer/tests/fixtures/ranks/ddp_rank0.pickle");
    let o = run(&["import", "torch", snapshot.to_str().unwrap(), "-o", missing.to_str().unwrap()]);
    assert_error(&o, "does not exist");
    assert!(!stderr(&o).contains(".partial"), "{}", stderr(&o));
}

/// `diff -o DIR` writes only files it could have written: a file of the user's under one of its
/// names is refused before anything is written (it was replaced), an input under one of its names
/// is refused before the other file is written, and a file given as DIR is refused.
#[test]
fn diff_outputs_never_replace_the_users_files() {
    let (a, b) = (trace("frag_oom.default"), trace("frag_oom.expandable"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = tmp("diff-out");
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("timeline-overlay.svg");
    let json = dir.join("diff.json");
    std::fs::remove_file(&svg).ok();
    std::fs::write(&json, "my notes").unwrap();
    let o = run(&["diff", a, b, "-o", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&json).unwrap(), "my notes");
    assert!(!svg.exists(), "nothing is written before the refusal");
    std::fs::remove_file(&json).unwrap();
    assert_eq!(run(&["diff", a, b, "-o", dir.to_str().unwrap()]).status.code(), Some(0));
    // Its own files are replaced.
    assert_eq!(run(&["diff", a, b, "-o", dir.to_str().unwrap()]).status.code(), Some(0));
    let o = run(&["diff", a, b, "-o", a]);
    assert_error(&o, "is a file");
}

/// `ranks` given one rank says there is nothing to compare (it said "1 traces ... skew 1.00x ...
/// the ranks hold the same bytes per call site"); `-o x.png` writes a PNG.
#[test]
fn ranks_of_one_rank_compares_nothing_and_draws_a_png() {
    let r0 = root().join("analyzer/tests/fixtures/ranks/ddp_rank0.pickle");
    let r1 = root().join("analyzer/tests/fixtures/ranks/ddp_rank1.pickle");
    let o = run(&["ranks", r0.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("ranks        1 trace,") && text.contains("one rank: its figures, nothing to compare"),
        "{text}"
    );
    assert!(!text.contains("skew") && !text.contains("the ranks hold the same"), "{text}");
    let png = tmp("ranks.png");
    std::fs::remove_file(&png).ok();
    let o = run(&["ranks", r0.to_str().unwrap(), r1.to_str().unwrap(), "-o", png.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
}

/// `synth` counts requests as `replay` does: allocations (it counted frees too, 2,084 where
/// `replay` said 1,054).
#[test]
fn synth_counts_requests_as_replay_does() {
    let out = tmp("synth_requests.atrace");
    std::fs::remove_file(&out).ok();
    let s = json_of(&["synth", "--json", "-o", out.to_str().unwrap(), "--events", "3000"], 0);
    let r = json_of(&["replay", "--json", out.to_str().unwrap()], 0);
    assert_eq!(s["requests"], r["requests"]);
    assert!(s["requests"].as_u64().unwrap() > 0);
}

/// Advice a user can act on where the trace has no call sites: explain said "free the 230 blocks
/// from (no call site recorded)", and leaks "if (no call site recorded) released its 230
/// block(s)"; both now say the blocks have no call site, and explain how to record them.
#[test]
fn blocks_without_a_call_site_are_not_named_as_one() {
    let p = root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let p = p.to_str().unwrap();
    let x: serde_json::Value = serde_json::from_slice(&run(&["explain", "--json", p]).stdout).unwrap();
    let code: Vec<&str> = x["advice"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "code")
        .map(|a| a["text"].as_str().unwrap())
        .collect();
    assert!(!code.is_empty(), "{x}");
    for text in code {
        assert!(!text.contains("(no call site recorded)"), "{text}");
        assert!(text.contains("_record_memory_history(stacks=\"python\")"), "{text}");
    }
    let leaks = String::from_utf8_lossy(&run(&["leaks", p]).stdout).into_owned();
    assert!(!leaks.contains("if (no call site recorded)"), "{leaks}");
    assert!(leaks.contains("block(s) without a call site"), "{leaks}");
}

/// A picture's title holds the trace's file name as text: a control character in the name is
/// shown escaped, never written raw into the SVG (where it made the file invalid XML).
#[cfg(unix)]
#[test]
fn a_file_name_with_control_characters_draws_valid_svg() {
    let dir = tmp("ctl-name");
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("a\u{1}b<&.atrace");
    std::fs::copy(trace("frag_oom.default"), &t).unwrap();
    for kind in ["timeline", "segments", "frag", "whatif"] {
        let svg = dir.join(format!("{kind}.svg"));
        let o = run(&["plot", t.to_str().unwrap(), "--kind", kind, "-o", svg.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{kind}: {}", stderr(&o));
        let bytes = std::fs::read(&svg).unwrap();
        assert!(bytes.iter().all(|&b| b >= 0x20 || b"\n\r\t".contains(&b)), "{kind}: a control character in the SVG");
        assert!(String::from_utf8_lossy(&bytes).contains("a\\x01b&lt;&amp;.atrace"), "{kind}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Nothing that cannot be made again is replaced: a recording (an import, a replay or a synthetic
/// trace wrote over one, exit 0); and an export's name says its format (a pickle went under
/// `.json`, JSON under `.pickle`).
#[test]
fn a_recording_is_never_replaced_and_exports_are_named_for_their_format() {
    let dir = tmp("keep-recording");
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("rec.atrace");
    std::fs::copy(trace("recorded_rust_workload"), &rec).unwrap();
    let before = std::fs::read(&rec).unwrap();
    let r = rec.to_str().unwrap();
    let snapshot = root().join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let t = trace("frag_oom.default");
    for args in [
        vec!["import", "torch", snapshot.to_str().unwrap(), "-o", r],
        vec!["replay", t.to_str().unwrap(), "-o", r],
        vec!["synth", "--events", "1000", "-o", r],
    ] {
        assert_error(&run(&args), "is a recording");
        assert_eq!(std::fs::read(&rec).unwrap(), before, "{args:?}");
    }
    // An import's own output is replaced as before.
    let imported = dir.join("imported.atrace");
    for _ in 0..2 {
        let o = run(&["import", "torch", snapshot.to_str().unwrap(), "-o", imported.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    for (format, name) in [("memory-viz", "x.json"), ("perfetto", "x.pickle")] {
        let out = dir.join(name);
        assert_error(
            &run(&["export", t.to_str().unwrap(), "--format", format, "-o", out.to_str().unwrap()]),
            "name it",
        );
        assert!(!out.exists());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A report written into an earlier report's folder leaves none of the earlier report's files
/// behind (gpt2_train's categories picture stayed beside frag_oom's report); a folder written
/// with --force keeps what is not the report's.
#[test]
fn a_report_over_an_earlier_one_leaves_none_of_its_files() {
    let dir = tmp("report-over");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let ok = |args: &[&str]| {
        let o = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    };
    ok(&["report", trace("gpt2_train.default").to_str().unwrap(), "-o", d]);
    assert!(dir.join("categories.svg").exists(), "gpt2_train's report draws categories");
    ok(&["report", trace("frag_oom.default").to_str().unwrap(), "-o", d]);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let stem = name.trim_end_matches(".svg").trim_end_matches(".png");
        assert!(name.starts_with("report.") || name == "summary.json" || md.contains(stem), "{name} left behind");
    }
    assert!(!dir.join("categories.svg").exists());
    // With --force, the user's files stay.
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    ok(&["report", trace("gpt2_train.default").to_str().unwrap(), "-o", d, "--force"]);
    ok(&["report", trace("frag_oom.default").to_str().unwrap(), "-o", d, "--force"]);
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "mine");
    std::fs::remove_dir_all(&dir).ok();
}

/// `diff` of a trace with call sites and one without compares no call sites: every byte of the
/// second would be "(no call site recorded)", gigabytes of change that is only how it was recorded.
#[test]
fn diff_compares_call_sites_only_where_both_traces_have_them() {
    let (a, b) = (trace("gpt2_train.default"), trace("recorded_gpt2_train"));
    let o = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("call sites: only A records them"), "{text}");
    assert!(!text.contains("(no call site recorded)"), "{text}");
}

/// A run with no limit is said one way by every command that states the limit ("no limit"),
/// never "none", "unlimited" or "no capacity limit".
#[test]
fn no_limit_is_said_one_way() {
    let t = trace("gpt2_train.default");
    let t = t.to_str().unwrap();
    let commands: [&[&str]; 5] =
        [&["summary", t], &["replay", t], &["whatif", "--no-search", t], &["explain", t], &["frag", t]];
    for args in commands {
        let o = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("no limit"), "{args:?} does not state the limit:\n{text}");
        for other in ["unlimited", "no capacity limit", "limit: none", "capacity     none", "capacity        none"] {
            assert!(!text.contains(other), "{args:?} says {other:?}:\n{text}");
        }
    }
    let report = std::fs::read_to_string(root().join("reports/gpt2_train.default/report.md")).unwrap();
    assert!(report.contains("with no limit") && !report.contains("unlimited"), "the report names the limit otherwise");
}

/// On snapshots taken at the OOM of third-party jobs, what is said of the whole job never goes
/// past what the trace tells (each checked against what PyTorch did, in the fixtures' truth):
/// - a UNet whose resolution varies per step (one whole iteration before the failure; PyTorch
///   ran out of memory under every setting at 3.40 GiB): no setting "predicted to need" a
///   figure below the limit without saying it holds only if later iterations ask no more;
/// - the same snapshot at a limit far above its own: the replays get past the failure, which
///   says nothing of the rest of the job (never "completes", never proven);
/// - a Hugging Face Trainer at 4.41 GiB: needs above the limit are said to be above it, and no
///   setting predicted to run out of memory later is the first pick;
/// - a Trainer's snapshot with two iterations: no leak (PyTorch completed the job).
#[test]
fn whole_job_claims_on_a_snapshot_never_overreach() {
    let doctor = root().join("tests/fixtures/doctor");
    let unet = doctor.join("unet_varres.3647995904.pickle");
    let unet = unet.to_str().unwrap();
    let text = |args: &[&str]| {
        let o = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    for cmd in ["explain", "whatif"] {
        let t = text(&[cmd, unet, "--capacity", "3647995904"]);
        assert!(t.contains("if later iterations ask no more"), "{cmd}: {t}");
        assert!(!t.contains("predicted to need about 2.68 GiB;"), "{cmd}: {t}");
        assert!(!t.contains("predicted to run out of memory at 3.40 GiB; needs about"), "{cmd}: {t}");
    }
    let j = json_of(&["explain", "--json", unet, "--capacity", "80GiB"], 0);
    assert_ne!(j["fix"]["strength"], "proven", "{}", j["fix"]);
    assert!(!j["fix"]["text"].as_str().unwrap_or("").contains("completes"), "{}", j["fix"]);
    let hf = doctor.join("hf_trainer.4732223488.pickle");
    let t = text(&["explain", hf.to_str().unwrap(), "--capacity", "4732223488"]);
    assert!(t.contains("expandable_segments:True; the whole job: about 4.65 GiB, more than the limit"), "{t}");
    // Every setting that gets past the failure is predicted to run out of memory later (PyTorch
    // ran out of memory under each at this limit): the first thing said is what the job needs.
    assert!(!t.contains("worth trying first"), "{t}");
    assert!(
        t.contains(
            "suggestion: the whole job is predicted to need about 4.90 GiB under the recorded settings (4.65 GiB with"
        ),
        "{t}"
    );
    let hf = doctor.join("hf_trainer.5116002304.pickle");
    let dir = tmp("hf-two-iterations");
    let o = run(&["report", hf.to_str().unwrap(), "--capacity", "5116002304", "-o", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let live = summary["findings"].as_array().unwrap().iter().find(|f| f["id"] == "live_at_end").unwrap();
    assert_ne!(live["verdict"], "problem", "{live}");
    assert!(!live["title"].as_str().unwrap().contains("leak"), "{live}");
}

/// `frag`'s segment map says which segments belong to a private pool (a CUDA graph's): their
/// free blocks serve only that pool, and the largest free block overall leaves them out.
#[test]
fn frag_marks_private_pool_segments() {
    let t = trace("recorded_graph_pools");
    let o = run(&["frag", t.to_str().unwrap(), "--at", "end"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("largest free block overall 16.00 MiB outside private pools"), "{text}");
    let pooled: Vec<&str> = text.lines().filter(|l| l.contains("private pool [0, 2]")).collect();
    assert!(pooled.iter().any(|l| l.contains("F 32.00 MiB")), "{text}");
}

/// Where a snapshot's limit was not recorded, a setting that fails at the least limit the trace
/// allows but gets past the failure below the most it allows is for the real limit to decide
/// (`limit_decides`): worth trying, from the limit where it gets past, never "not advised". On a
/// Hugging Face Trainer's snapshot (limit in [4.51, 4.90) GiB; the real one, 4.76 GiB, is in its
/// name) `expandable_segments:True`, `max_split_size_mb:64` and `:128` completed the job in
/// PyTorch, and were once ruled out; the what-if table, the JSON and the text say the same.
#[test]
fn an_unknown_limit_rules_out_no_setting_that_may_help_at_it() {
    let hf = root().join("tests/fixtures/doctor/hf_trainer.5116002304.pickle");
    let hf = hf.to_str().unwrap();
    let j = json_of(&["explain", "--json", hf], 0);
    assert_eq!(j["capacity_source"], "inferred_limit");
    let lines = |k: &str| j[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let (not_advised, cannot_tell) = (lines("not_advised"), lines("cannot_tell"));
    let w = json_of(&["whatif", "--json", hf], 0);
    let text = String::from_utf8_lossy(&run(&["explain", hf]).stdout).into_owned();
    for completed in ["expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:128"] {
        assert!(!not_advised.iter().any(|l| l.contains(completed)), "{completed}: {not_advised:?}");
        assert!(!cannot_tell.iter().any(|l| l.contains(completed)), "{completed}: {cannot_tell:?}");
        let row = j["whatif"].as_array().unwrap().iter().find(|r| r["policy"] == completed).unwrap();
        let table = w["rows"].as_array().unwrap().iter().find(|r| r["policy"] == completed).unwrap();
        assert_eq!(row["decision"], "limit_decides", "{completed}: {row}");
        assert_eq!(table["decision"], row["decision"], "{completed}: whatif and explain decide alike");
        let worth = j["worth_trying"].as_array().unwrap().iter().find(|x| x["policy"] == completed);
        let worth = worth.unwrap_or_else(|| panic!("{completed} is not worth trying: {}", j["worth_trying"]));
        assert_eq!(worth["gets_past_from_bytes"], row["min_capacity_bytes"], "{completed}");
        let from = worth["gets_past_from_bytes"].as_u64().unwrap();
        // Inside the range: above the least limit, below the one where the request gets its segment.
        let high =
            j["verdict_by_limit"].as_array().unwrap().iter().filter_map(|v| v["to_bytes"].as_u64()).max().unwrap();
        assert!(from > j["capacity_bytes"].as_u64().unwrap() && from < high, "{completed}: {from}");
        assert!(text.contains(completed), "{completed}:\n{text}");
    }
    // The first pick is the one the whole job needs least under.
    assert_eq!(j["fix"]["setting"], j["worth_trying"][0]["setting"]);
    assert!(text.contains("give the real one with --capacity"), "{text}");
}

/// A replay under settings that ask for segments the recorded run did not places them by the
/// driver's rule and says how many, in `replay` and `frag`, text and JSON; under the recorded
/// settings every segment takes its recorded address and nothing is said of the rule.
#[test]
fn segments_placed_by_the_rule_are_counted_and_said() {
    let t = root().join("tests/fixtures/truth/amp_adamw.default.atrace");
    let t = t.to_str().unwrap();
    let own = json_of(&["replay", "--json", "--unlimited", t], 0);
    assert_eq!(own["used_recorded_addresses"], true);
    assert_eq!(own["segments_placed_by_rule"], 0);
    assert_eq!(own["segments_at_recorded_addresses"], own["num_device_alloc"]);
    let conf = "roundup_power2_divisions:4";
    let other = json_of(&["replay", "--json", "--unlimited", "--conf", conf, t], 0);
    let (at, by_rule) =
        (other["segments_at_recorded_addresses"].as_u64().unwrap(), other["segments_placed_by_rule"].as_u64().unwrap());
    assert!(at > 0 && by_rule > 0, "{other}");
    assert_eq!(at + by_rule, other["num_device_alloc"].as_u64().unwrap());
    let frag = json_of(&["frag", "--json", "--conf", conf, t], 0);
    assert_eq!(frag["segments_placed_by_rule"].as_u64(), Some(by_rule));
    for (args, said) in [
        (vec!["replay", "--unlimited", t], false),
        (vec!["replay", "--unlimited", "--conf", conf, t], true),
        (vec!["frag", t], false),
        (vec!["frag", "--conf", conf, t], true),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout).replace("\n  ", " ").replace("\n                ", " ");
        let expected = format!("{at} of {} segments at the recorded addresses", at + by_rule);
        assert_eq!(text.contains(&expected), said, "{args:?}: {text}");
        assert_eq!(text.contains("placed by a rule for where the CUDA driver puts them"), said, "{args:?}: {text}");
    }
}

/// A trace cut short (a killed job's recorder leaves one without its trailer) that shows no OOM
/// in what was read is not called a completed run: what came after the damage may have failed.
#[test]
fn a_cut_trace_without_an_oom_is_not_called_completed() {
    let bytes = std::fs::read(root().join("tests/fixtures/doctor/hf_trainer.4994367488.atrace")).unwrap();
    let f = tmp("killed.atrace");
    std::fs::write(&f, &bytes[..18541]).unwrap();
    let f = f.to_str().unwrap();
    let o = run(&["explain", f]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).replace("\n  ", " ");
    assert!(text.contains("no out-of-memory in the events read"), "{text}");
    assert!(text.contains("events read before the damage complete"), "{text}");
    assert!(!text.contains("the run completed"), "{text}");
    let j = json_of(&["explain", "--json", f], 3);
    let reason = j["verdict"]["reason"].as_str().unwrap();
    assert!(reason.contains("before the damage") && !reason.contains("the run completed"), "{reason}");
    // The whole trace, which ends in its OOM, is not affected.
    let whole = root().join("tests/fixtures/doctor/hf_trainer.4994367488.atrace");
    let text = String::from_utf8_lossy(&run(&["explain", whole.to_str().unwrap()]).stdout).into_owned();
    assert!(!text.contains("before the damage"), "{text}");
}

/// A setting worth trying for the failure whose whole job is predicted to need more than the
/// limit says so beside it (on amp_adamw at 0.90x, one whole iteration before the failure:
/// `max_split_size_mb:64` gets past the failure at 963 MiB, and its whole job is predicted to
/// need about 1.03 GiB; in PyTorch it ran out of memory at 963 MiB and completed at 1.04 GiB).
#[test]
fn a_whole_job_over_the_limit_is_said_beside_the_first_pick() {
    let t = root().join("tests/fixtures/truth/amp_adamw.default.0.90.pickle");
    let o = run(&["explain", t.to_str().unwrap(), "--capacity", "963MiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).replace("\n  ", " ");
    let first = text.lines().find(|l| l.starts_with("worth trying first")).expect("a first pick");
    assert!(first.contains("over the limit, if later iterations ask no more"), "{first}");
    // The whole job's capacity under that same setting is not said again below it ("also: the
    // whole job needs about 1.03 GiB with max_split_size_mb:64"); the JSON
    // keeps the advice.
    assert!(!text.contains("also: the whole job"), "{text}");
    let j = json_of(&["explain", "--json", t.to_str().unwrap(), "--capacity", "963MiB"], 0);
    let capacity = j["advice"].as_array().unwrap().iter().find(|a| a["kind"] == "capacity").expect("capacity advice");
    assert_eq!(capacity["setting"], j["fix"]["setting"], "{j}");
}

/// `frag`'s default text fits a screen: the segment map prints ten shapes, those whose segments
/// hold the largest free blocks (on the timm ViT's snapshot, 121 lines before, the segment with
/// the 104.30 MiB free block that the 132 MiB request could not use among them), and says how
/// many it left out and how large their free blocks are at most.
#[test]
fn frag_fits_a_screen_and_shows_the_largest_free_blocks() {
    let t = root().join("tests/fixtures/doctor/timm_vit_amp.2828009472.pickle");
    let o = run(&["frag", t.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.lines().count() <= 60, "{} lines:\n{text}", text.lines().count());
    let map: Vec<&str> = text.lines().filter(|l| l.starts_with("  0x")).collect();
    assert_eq!(map.len(), 10, "{text}");
    assert!(map.iter().any(|l| l.contains("132.00 MiB") && l.contains("F 104.30 MiB")), "{text}");
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("largest free 104.30 MiB"), "{text}");
    assert!(words.contains("more segments of") && words.contains("--max-segments N shows more"), "{text}");
}

/// The report says how to make it again: with the limit where one was given (without it, the
/// command replays at the limit the snapshot implies, and says other things).
#[test]
fn a_reports_made_with_line_keeps_the_limit_given() {
    let t = root().join("tests/fixtures/doctor/timm_vit_amp.2828009472.pickle");
    let dir = std::env::temp_dir().join(format!("alloctrace-made-with-{}", std::process::id()));
    let o = run(&["report", t.to_str().unwrap(), "--capacity", "2828009472", "-o", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(md.contains("Made with `alloctrace report timm_vit_amp.2828009472.pickle --capacity 2828009472`"), "{md}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Every command opens its input one way: `leaks` takes the run flags (`--capacity`, `--conf`,
/// `--torch-version`, `--device`), and on a snapshot without its limit it looks at the failure
/// `explain` explains (it looked at event 1264 of `stream_pipeline` at 1196425216 bytes, a
/// failure that never happened, while `explain` explained the real one at event 6037).
#[test]
fn leaks_takes_the_run_flags_and_looks_at_the_failure_explain_explains() {
    let p = root().join("tests/fixtures/doctor/stream_pipeline.1196425216.pickle");
    let p = p.to_str().unwrap();
    let x = json_of(&["explain", "--json", p], 0);
    let l = json_of(&["leaks", "--json", p], 0);
    assert_eq!(l["retention"]["moment"], "oom");
    assert_eq!(l["retention"]["event"], x["oom_event"], "leaks and explain look at one failure");
    assert_eq!(x["oom_event"], x["recorded_ooms"].as_array().unwrap().last().unwrap()["event"]);
    let given = json_of(&["leaks", "--json", p, "--capacity", "1196425216"], 0);
    assert_eq!(given["retention"]["event"], x["oom_event"]);
}
