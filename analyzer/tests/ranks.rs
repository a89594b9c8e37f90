//! `alloctrace ranks`: one view across ranks, on per-rank traces made from the shipped ones and
//! on a real two-rank DDP run with unequal batches (fixtures/ranks, see its README).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ranks").join(name).display().to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().expect("run alloctrace")
}

fn json(args: &[&str]) -> Value {
    let o = run(args);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-ranks-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn peak_reserved(trace: &Path) -> u64 {
    json(&["summary", trace.to_str().unwrap(), "--json"])["peak_reserved_bytes"].as_u64().unwrap()
}

#[test]
fn the_unequal_ddp_run_names_rank_1_and_the_sites_that_differ() {
    let (r0, r1) = (fixture("ddp_rank0.pickle"), fixture("ddp_rank1.pickle"));
    // Arguments in either order: ranks come from the file names.
    let v = json(&["ranks", &r1, &r0, "--json"]);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    assert_eq!(ranks[0]["rank"], 0);
    assert_eq!(ranks[1]["rank"], 1);
    assert_eq!(ranks[1]["rank_source"], "file_name");
    assert_eq!(v["peaking_rank"], 1);
    let (p0, p1) =
        (ranks[0]["peak_reserved"]["bytes"].as_u64().unwrap(), ranks[1]["peak_reserved"]["bytes"].as_u64().unwrap());
    assert!(p1 > 2 * p0, "rank 1 ran 4x the batch: {p0} vs {p1}");
    let skew = v["skew_reserved"].as_f64().unwrap();
    assert!((skew - p1 as f64 / ((p0 + p1) as f64 / 2.0)).abs() < 1e-9);
    // Both ranks ran the same three iterations (record_function("iteration")).
    for r in ranks {
        assert_eq!(r["iterations"], 3, "{r}");
        assert_eq!(r["iterations_from"], "the annotation \"iteration START\"");
        assert_eq!(r["ooms"], 0);
    }
    assert_eq!(v["aligned_on_iterations"], true);
    // The site that differs most is the model's forward (activations scale with the batch),
    // then the batch itself; every differing site holds more on rank 1.
    let sites = v["differing_sites"].as_array().unwrap();
    assert!(
        sites[0]["site"]["label"].as_str().unwrap().starts_with("scripts/gpu/ranks_ddp.py:30 (forward)"),
        "{sites:?}"
    );
    let named: Vec<&str> = sites.iter().map(|s| s["site"]["label"].as_str().unwrap()).collect();
    assert!(named.iter().any(|s| s.starts_with("scripts/gpu/ranks_ddp.py:44 (worker)")), "the batch: {named:?}");
    for s in sites {
        let b = s["bytes"].as_array().unwrap();
        assert!(b[1].as_u64() > b[0].as_u64(), "{s}");
    }
    // Why rank 1: the same parameters (the MLP's 8,410,128 fp32 values, each of its 6 tensors
    // rounded up to 512 bytes), four times the activations.
    let cat = |r: &Value, k: &str| r["categories_at_peak"][k].as_u64().unwrap();
    for r in ranks {
        let p = cat(r, "parameter");
        assert!(p >= 8_410_128 * 4 && p - 8_410_128 * 4 <= 6 * 512, "{p}");
    }
    assert!(cat(&ranks[1], "activation") > 3 * cat(&ranks[0], "activation"));
    // The timelines run over the aligned axis: before the first iteration, then 3.
    for t in v["timelines"].as_array().unwrap() {
        let last = t["points"].as_array().unwrap().last().unwrap()[0].as_f64().unwrap();
        assert!((3.0..4.0).contains(&last), "{last}");
    }
}

#[test]
fn text_names_the_peaking_rank_and_writes_a_deterministic_picture() {
    let (r0, r1) = (fixture("ddp_rank0.pickle"), fixture("ddp_rank1.pickle"));
    let (a, b) = (tmp("a.svg"), tmp("b.svg"));
    let o = run(&["ranks", &r0, &r1, "-o", a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("peaking rank 1:"), "{text}");
    assert!(text.contains("scripts/gpu/ranks_ddp.py:30 (forward)"), "{text}");
    run(&["ranks", &r0, &r1, "-o", b.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&a).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("rank 1") && svg.contains("aligned on iterations"));
    assert_eq!(svg, std::fs::read_to_string(&b).unwrap(), "the picture is deterministic");
}

#[test]
fn ranks_of_traces_made_from_the_shipped_ones() {
    // Three "ranks": copies of shipped traces named as a launcher names them.
    let ranks = [
        ("job.rank_0.atrace", "traces/resnet50_train.default.atrace"),
        ("job.rank_1.atrace", "traces/gpt2_train.default.atrace"),
        ("job.rank_2.atrace", "traces/frag_oom.default.atrace"),
    ];
    let mut peaks = Vec::new();
    let mut args = vec!["ranks".to_string(), "--json".to_string()];
    for (name, src) in ranks.iter().rev() {
        let p = tmp(name);
        std::fs::copy(root().join(src), &p).unwrap();
        peaks.push(peak_reserved(&p));
        args.push(p.display().to_string());
    }
    peaks.reverse();
    let v = json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let rows = v["ranks"].as_array().unwrap();
    for (k, r) in rows.iter().enumerate() {
        assert_eq!(r["rank"], k as u64);
        assert_eq!(r["peak_reserved"]["bytes"].as_u64().unwrap(), peaks[k], "the same peak as summary");
    }
    let max = *peaks.iter().max().unwrap();
    assert_eq!(v["peaking_rank"], peaks.iter().position(|&p| p == max).unwrap() as u64);
    let mut sorted = peaks.clone();
    sorted.sort();
    assert!((v["skew_reserved"].as_f64().unwrap() - max as f64 / sorted[1] as f64).abs() < 1e-9);
    // frag_oom ran out of memory once.
    assert_eq!(rows[2]["ooms"], 1);

    // Two files naming the same rank: ranks by position, which stay distinct.
    let dup = tmp("other_rank_0.atrace");
    std::fs::copy(root().join("traces/gpt2_train.default.atrace"), &dup).unwrap();
    let first = tmp("job.rank_0.atrace");
    let v = json(&["ranks", "--json", first.to_str().unwrap(), dup.to_str().unwrap()]);
    let rows = v["ranks"].as_array().unwrap();
    assert_eq!((rows[0]["rank"].as_u64(), rows[1]["rank"].as_u64()), (Some(0), Some(1)));
    assert_eq!(rows[1]["rank_source"], "position");
}

#[test]
fn bad_and_damaged_inputs() {
    let o = run(&["ranks", "/nonexistent/rank0.atrace"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/rank0.atrace"));
    let o = run(&["ranks"]);
    assert_eq!(o.status.code(), Some(2));
    // A truncated rank is analysed up to the damage: exit 3, with the warning.
    let bytes = std::fs::read(root().join("traces/gpt2_train.default.atrace")).unwrap();
    let cut = tmp("cut_rank1.atrace");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let whole = root().join("traces/resnet50_train.default.atrace");
    let o = run(&["ranks", whole.to_str().unwrap(), cut.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cut_rank1.atrace"));
}

#[test]
fn a_report_of_several_ranks_is_of_the_peaking_rank_with_a_section_across_them() {
    let (r0, r1) = (fixture("ddp_rank0.pickle"), fixture("ddp_rank1.pickle"));
    let dir = tmp("report-ranks");
    let _ = std::fs::remove_dir_all(&dir);
    let v = json(&["report", &r0, &r1, "-o", dir.to_str().unwrap(), "--json"]);
    // The report is of rank 1's trace, the one that peaks, whatever the order given.
    assert_eq!(v["trace"], "ddp_rank1.pickle");
    assert_eq!(v["ranks"]["peaking_rank"], 1);
    assert_eq!(v["ranks"]["ranks"].as_array().unwrap().len(), 2);
    // A report names its traces by file name (it is a function of them, not of where they lie).
    assert_eq!(v["ranks"]["ranks"][1]["trace"], "ddp_rank1.pickle");
    assert!(v["ranks"]["skew_reserved"].as_f64().unwrap() > 1.2);
    // The same view as `ranks` gives (one home for both).
    let ranks = json(&["ranks", &r0, &r1, "--json"]);
    assert_eq!(v["ranks"]["differing_sites"], ranks["differing_sites"]);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("## Across the ranks (2 traces)"), "{md}");
    assert!(md.contains("Rank 1 peaks"), "{md}");
    assert!(md.contains("scripts/gpu/ranks_ddp.py:30 (forward)"), "{md}");
    assert!(md.contains("[![Across the ranks](ranks.png)](ranks.svg)"), "{md}");
    assert!(dir.join("ranks.png").is_file());
    let svg = std::fs::read_to_string(dir.join("ranks.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
    // And what the memory is for, with its stacked timeline.
    assert!(md.contains("## What the memory is for"), "{md}");
    assert!(dir.join("categories.svg").is_file());
    assert_eq!(v["categories"]["phases_from"], "frames");
    // One trace: no section across ranks.
    let one = tmp("report-one");
    let _ = std::fs::remove_dir_all(&one);
    let v = json(&["report", &r0, "-o", one.to_str().unwrap(), "--json"]);
    assert!(v.get("ranks").is_none());
    assert!(!one.join("ranks.svg").exists());
}

fn phases_fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/phases").join(name).display().to_string()
}

#[test]
fn recorded_ranks_with_phase_marks_name_the_larger_batch() {
    // Two DDP ranks recorded by `alloctrace record -- torchrun` (fixtures/phases), rank 1 with a
    // 4x larger batch.
    let (r0, r1) = (phases_fixture("ddp.rank0.atrace"), phases_fixture("ddp.rank1.atrace"));
    let v = json(&["ranks", &r1, &r0, "--json"]);
    assert_eq!(v["peaking_rank"], 1);
    assert_eq!(v["aligned_on_iterations"], true);
    let rows = v["ranks"].as_array().unwrap();
    assert_eq!(rows[0]["iterations_from"], "iteration marks");
    // The path as given, as every command's `trace` (it was the file name alone).
    assert_eq!(rows[1]["trace"], r1.as_str());
    let u = |x: &Value| x.as_u64().unwrap();
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(phases_fixture("ddp.rank1.json")).unwrap()).unwrap();
    assert_eq!(u(&truth["optimizer_state_bytes"]), 2 * u(&truth["parameter_bytes"]), "AdamW");
    for (rank, trace) in [(0, &r0), (1, &r1)] {
        let c = json(&["summary", trace, "--json"])["categories"].clone();
        assert_eq!(c["phases_from"], "phase marks");
        assert_eq!(c["forward_passes"], 3);
        // AdamW's state, from the marks alone (no call sites), to the 512-byte rounding of its
        // 12 tensors.
        let state = u(&c["max"]["optimizer_state"]);
        let want = u(&truth["optimizer_state_bytes"]);
        assert!(state >= want && state - want <= 12 * 512, "rank {rank}: {state} vs {want}");
    }
    // The larger batch shows as activations at each rank's peak.
    let act = |k: usize| u(&rows[k]["categories_at_peak"]["activation"]);
    assert!(act(1) > act(0), "{} vs {}", act(1), act(0));
}

/// DDP with NCCL on two GPUs under `alloctrace record` (fixtures/ranks/nccl, see its README):
/// one trace per rank, each header naming its rank and device, and each rank's replay reaching
/// the peaks PyTorch reported for it in that run.
#[test]
fn a_two_gpu_ddp_run_gives_one_trace_per_rank_that_replays_to_its_peaks() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ranks/nccl");
    let printed = std::fs::read_to_string(dir.join("recorded_run.txt")).unwrap();
    for rank in [0u32, 1] {
        let path = dir.join(format!("ddp.rank{rank}.atrace"));
        let h = recorder::trace::TraceReader::open(&path).unwrap().header().placement;
        assert_eq!(
            (h.rank, h.local_rank, h.world_size, h.device_index),
            (Some(rank), Some(rank), Some(2), Some(rank)),
            "rank {rank}"
        );
        let line = printed.lines().find(|l| l.starts_with(&format!("peaks rank {rank} "))).unwrap();
        let field = |name: &str| -> u64 {
            let mut w = line.split_whitespace();
            w.find(|x| *x == name).and_then(|_| w.next()).unwrap().parse().unwrap()
        };
        let j = json(&["replay", "--json", path.to_str().unwrap()]);
        assert_eq!(j["peak_reserved_bytes"].as_u64(), Some(field("max_memory_reserved")), "rank {rank}");
        assert_eq!(j["peak_allocated_bytes"].as_u64(), Some(field("max_memory_allocated")), "rank {rank}");
        let c = recorder::recorder::replay::check_segments(&path).unwrap();
        assert!(c.same(), "rank {rank}: first difference at {:?}", c.first_difference());
    }
}

/// Fragmentation has one measure: each rank's figure at its peak is `frag --at peak`'s, on the
/// DDP snapshots and on a shipped trace (where the peak's segment and the request it serves are
/// two records).
#[test]
fn each_ranks_fragmentation_at_its_peak_is_frags() {
    let gpt2 = root().join("traces/gpt2_train.default.atrace").display().to_string();
    let inputs = [fixture("ddp_rank0.pickle"), fixture("ddp_rank1.pickle"), gpt2];
    let v = json(&["ranks", &inputs[0], &inputs[1], &inputs[2], "--json"]);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 3);
    for (input, r) in inputs.iter().zip(ranks) {
        let f = json(&["frag", input, "--at", "peak", "--json"]);
        let m = f["measures"].as_array().unwrap().iter().find(|m| m["name"] == "reserved_vs_allocated").unwrap();
        let (ranks_frag, frag) = (r["fragmentation_at_peak"].as_f64().unwrap(), m["at_peak"].as_f64().unwrap());
        assert!((ranks_frag - frag).abs() < 1e-9, "{input}: ranks {ranks_frag}, frag {frag}");
    }
}
