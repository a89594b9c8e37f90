//! `explain` on the shipped traces and on small synthetic traces with a known cause.

use analyzer::analysis::explain::{explain, ExplainReport, VerdictKind};
use analyzer::model::Trace;
use recorder::trace::{Event, Frame, Header, MarkKind, Pool, Record, Source, TraceWriter};
use std::path::{Path, PathBuf};

fn trace(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../traces/")).join(name)
}

const MIB: u64 = 1 << 20;

/// Every setting advised must be one whose replay completed at the same capacity.
fn check_advice_is_backed(r: &ExplainReport) {
    for a in r.advice.iter().filter(|a| a.kind == "setting") {
        let s = a.setting.as_deref().unwrap();
        let row = r
            .whatif
            .iter()
            .find(|w| s == format!("PYTORCH_CUDA_ALLOC_CONF={}", w.alloc_conf))
            .expect("advised setting is a what-if row");
        if r.moment == "oom" {
            assert_eq!(row.outcome, "ok", "{s} advised but its replay runs out of memory");
        }
    }
    assert!(r.advice.iter().all(|a| !a.evidence.is_empty()));
}

#[test]
fn frag_oom_is_fragmentation_and_expandable_is_not_advised() {
    let r = explain(&Trace::open(&trace("frag_oom.default.atrace")).unwrap()).unwrap();
    check_advice_is_backed(&r);
    assert_eq!(r.moment, "oom");
    assert_eq!(r.verdict.kind, VerdictKind::Fragmentation, "{}", r.verdict.reason);
    let f = &r.figures;
    assert_eq!(f.requested_bytes, 1 << 30);
    assert_eq!(f.capacity_bytes, Some(2 << 30));
    // Live tensors and the request fit under the limit together; no free block holds the request.
    assert!(f.allocated_bytes + f.requested_bytes <= 2 << 30);
    assert!(f.largest_free_bytes < f.requested_bytes);
    assert_eq!(f.reserved_unallocated_bytes, f.reserved_bytes - f.allocated_bytes);
    // The trace recorded the driver's free memory: the context and others hold the rest.
    let outside = f.held_outside_bytes.expect("the oom event recorded device free bytes");
    assert!(outside > 0 && outside < f.device_total_bytes.unwrap());
    let msg = r.pytorch_message.as_deref().unwrap();
    // PyTorch's format_size writes sizes up to 1 GiB in MiB: a 1 GiB segment reads 1024.00 MiB.
    assert!(msg.contains("Tried to allocate 1024.00 MiB") && msg.contains("2.00 GiB allowed"), "{msg}");
    // The replay at 2 GiB under expandable segments runs out of memory too (as PyTorch 2.11 did),
    // so no advice may claim it fixes this.
    let exp = r.whatif.iter().find(|w| w.policy == "expandable_segments:True").unwrap();
    assert_eq!(exp.outcome, "oom");
    for a in &r.advice {
        assert!(!a.text.contains("expandable"), "advice claims expandable segments help: {}", a.text);
        assert!(a.setting.as_deref().is_none_or(|s| !s.contains("expandable_segments:True")));
    }
    assert!(r.not_advised.iter().any(|n| n.starts_with("expandable_segments:True")));
    // No setting gets past the failed request at 2 GiB. The trace is a prefix with no iterations:
    // the capacity figure says from where the failed request is served, and that the rest of the
    // job is not in the trace; it is never called the capacity that completes.
    assert!(r.whatif.iter().all(|w| w.outcome == "oom" && !w.reach.gets_past()));
    assert!(matches!(r.prediction, Some(analyzer::analysis::outcome::JobPrediction::CannotTell { .. })));
    let cap = r.advice.iter().find(|a| a.kind == "capacity").expect("a capacity figure");
    let rec_min = r.whatif[0].min_capacity_bytes.unwrap();
    assert!(rec_min > 2 << 30);
    assert!(cap.evidence.contains(&analyzer::model::units::fmt_bytes(rec_min)));
    assert!(cap.text.contains("not in the trace") && !cap.text.contains("complete"), "{}", cap.text);
    // The reordering experiment is a replay, and its advice is present only because it completed.
    let e = r.experiments.iter().find(|e| e.name.contains("long-lived")).expect("experiment ran");
    assert!(e.completes);
    assert!(e.peak_reserved_bytes <= 2 << 30);
    assert!(r.advice.iter().any(|a| a.kind == "code" && a.evidence.contains("replayed")));
}

#[test]
fn frag_oom_expandable_is_fragmentation_too() {
    let r = explain(&Trace::open(&trace("frag_oom.expandable.atrace")).unwrap()).unwrap();
    check_advice_is_backed(&r);
    assert_eq!(r.verdict.kind, VerdictKind::Fragmentation, "{}", r.verdict.reason);
    assert!(r.advice.iter().all(|a| a.kind != "setting"));
}

#[test]
fn leak_list_append_has_no_oom_but_names_the_growing_line() {
    let r = explain(&Trace::open(&trace("leak_list_append.default.atrace")).unwrap()).unwrap();
    check_advice_is_backed(&r);
    assert_eq!(r.moment, "peak");
    assert_eq!(r.verdict.kind, VerdictKind::NoOom);
    assert!(r.pytorch_message.is_none());
    assert!(r.verdict.reason.contains("workloads.py:81 (leak_list_append)"), "{}", r.verdict.reason);
    assert!(r.advice.iter().any(|a| a.kind == "code" && a.text.contains("workloads.py:81")));
    // At the peak, the forward pass line holds the most memory.
    assert_eq!(r.top_sites[0].site.line, 81);
}

fn write_trace(path: &Path, capacity: u64, events: Vec<Event>) {
    let mut h = Header::new(Source::Simulated);
    h.capacity_bytes = capacity;
    let mut w = TraceWriter::create(path, &h).unwrap();
    for (t, event) in events.into_iter().enumerate() {
        w.write(&Record { time_ns: t as u64 * 1000, event }).unwrap();
    }
    w.finish().unwrap();
}

fn alloc(id: u64, bytes: u64, callsite: u32) -> Event {
    Event::Alloc { id, addr: 0, requested_bytes: bytes, block_bytes: 0, stream: 0, pool: Pool::Large, callsite }
}

fn free(id: u64) -> [Event; 2] {
    [Event::FreeRequested { id, addr: 0, callsite: 0 }, Event::FreeCompleted { id, addr: 0 }]
}

fn callsite(id: u32, line: u32) -> Event {
    Event::CallSite {
        id,
        frames: vec![
            Frame {
                file: "/venv/lib/python3.12/site-packages/torch/functional.py".into(),
                line: 1,
                function: "op".into(),
            },
            Frame { file: "train.py".into(), line, function: "step".into() },
        ],
    }
}

#[test]
fn live_bytes_over_the_limit_are_true_exhaustion() {
    let dir = std::env::temp_dir().join(format!("answers-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("exhaustion.atrace");
    let mut ev = vec![callsite(1, 7), alloc(1, 80 * MIB, 1)];
    ev.push(alloc(2, 40 * MIB, 1));
    write_trace(&path, 100 * MIB, ev);
    let r = explain(&Trace::open(&path).unwrap()).unwrap();
    assert_eq!(r.moment, "oom");
    assert_eq!(r.verdict.kind, VerdictKind::TrueExhaustion, "{}", r.verdict.reason);
    assert_eq!(r.figures.requested_bytes, 40 * MIB);
    assert_eq!(r.top_sites[0].site.label, "train.py:7 (step)");
    check_advice_is_backed(&r);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn growth_every_iteration_is_steady_growth() {
    let dir = std::env::temp_dir().join(format!("answers-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("growth.atrace");
    let mut ev = vec![callsite(1, 10), callsite(2, 12)];
    let mut id = 0;
    for step in 0..20 {
        ev.push(Event::Mark { kind: MarkKind::Iteration, text: format!("step {step}") });
        id += 1;
        ev.push(alloc(id, 20 * MIB, 1)); // kept: a leak
        id += 1;
        ev.push(alloc(id, 20 * MIB, 2)); // temporary
        ev.extend(free(id));
    }
    write_trace(&path, 200 * MIB, ev);
    let r = explain(&Trace::open(&path).unwrap()).unwrap();
    assert_eq!(r.moment, "oom");
    assert_eq!(r.verdict.kind, VerdictKind::SteadyGrowth, "{}", r.verdict.reason);
    let g = r.growth.as_ref().unwrap();
    assert_eq!(g.source, "iteration marks");
    assert_eq!(g.sites[0].site.label, "train.py:10 (step)");
    assert_eq!(g.sites[0].per_iteration_bytes, (20 * MIB) as f64);
    assert!(g.sites.iter().all(|s| s.site.line != 12), "the temporary does not grow");
    assert!(r.advice.iter().any(|a| a.kind == "code" && a.text.contains("train.py:10")));
    check_advice_is_backed(&r);
    std::fs::remove_file(&path).unwrap();
}

/// Which recorded OOMs the program caught is decided once, as the trace is read (a later
/// request was made): explain's JSON flags them and its text counts them. `oom_catch` caught its
/// one OOM and went on; `frag_oom`, replayed under a limit that serves its failed request, gets
/// past an OOM that ended the run, which it neither counts nor flags as caught.
#[test]
fn caught_ooms_are_decided_once_and_rendered() {
    let run = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let catch = root.join("tests/fixtures/truth/oom_catch.default.atrace");
    let frag = trace("frag_oom.default.atrace");
    for (path, capacity, caught) in [(catch.as_path(), None, 1usize), (frag.as_path(), Some("8GiB"), 0)] {
        let p = path.to_str().unwrap();
        let mut args = vec!["explain", p];
        if let Some(c) = capacity {
            args.extend(["--capacity", c]);
        }
        let text = run(&args).split_whitespace().collect::<Vec<_>>().join(" ");
        args.push("--json");
        let json: serde_json::Value = serde_json::from_str(&run(&args)).unwrap();
        let ooms = json["recorded_ooms"].as_array().unwrap();
        assert!(!ooms.is_empty(), "{p}");
        let flagged = ooms.iter().filter(|o| o["caught"] == true).count();
        assert_eq!(flagged, caught, "{p}: {ooms:?}");
        let t = Trace::open(path).unwrap();
        assert_eq!(t.facts.caught_ooms(), caught, "{p}");
        if caught > 0 {
            assert!(text.contains(&format!("the program caught {caught} out-of-memory error")), "{p}: {text}");
        } else {
            assert!(!text.contains("the program caught"), "{p}: {text}");
        }
    }
}
