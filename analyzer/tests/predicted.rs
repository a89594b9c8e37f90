//! Predicted request streams (`alloctrace.predict`, `fixtures/predicted/`, see its README): the
//! importer reads them as predicted, every command says so, and their peaks are compared with
//! real H100 runs of the same steps.

use analyzer::import::torch::{PREDICTED_KEY, PREDICTED_NOTE};
use analyzer::import::{import_file, ImportOptions};
use recorder::trace::{Event, MarkKind};
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/")).join(name)
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().expect("run alloctrace");
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn text(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().expect("run alloctrace");
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn a_predicted_snapshot_is_read_as_predicted() {
    let path = fixture("predicted/mlp_infer.pickle");
    let imported = import_file(&path, &ImportOptions::default()).unwrap();
    assert!(imported.report.warnings.is_empty(), "{:?}", imported.report.warnings);
    let notes: Vec<_> = imported.header.notes.iter().filter(|n| n.starts_with(PREDICTED_NOTE)).collect();
    assert_eq!(notes.len(), 1, "{:?}", imported.header.notes);
    assert!(notes[0].contains("FakeTensorMode") && notes[0].contains("make_step, 2 steps"), "{}", notes[0]);

    // The counts of the README (15 alloc, 15 + 15 frees), the phases and the two iterations.
    let mut allocs = Vec::new();
    let (mut frees, mut phases, mut iterations, mut annotations) = (0, Vec::new(), Vec::new(), 0);
    for r in &imported.records {
        match &r.event {
            Event::Alloc { requested_bytes, .. } => allocs.push(*requested_bytes),
            Event::FreeRequested { .. } | Event::FreeCompleted { .. } => frees += 1,
            Event::Mark { kind: MarkKind::Phase, text } => phases.push(text.clone()),
            Event::Mark { kind: MarkKind::Iteration, text } => iterations.push(text.clone()),
            Event::Mark { kind: MarkKind::Annotation, .. } => annotations += 1,
            _ => {}
        }
    }
    assert_eq!((allocs.len(), frees), (15, 30));
    assert_eq!(iterations, ["iteration 0", "iteration 1"]);
    assert_eq!(annotations, 0, "a predicted stream's START annotations are phase and iteration marks");
    assert_eq!(phases, ["setup", "other", "forward", "other", "forward", "end"]);
    // PyTorch's cuBLAS workspace on compute capability 9.0 (32 MiB) and cuBLASLt's (1 MiB).
    assert_eq!(allocs.iter().filter(|&&b| b == 32 << 20).count(), 1, "{allocs:?}");
    // Parameters (4096x1024 and 10x4096 fp32) and the input (256x1024 fp32).
    for b in [4096 * 1024 * 4, 10 * 4096 * 4, 256 * 1024 * 4] {
        assert!(allocs.contains(&b), "{b} in {allocs:?}");
    }

    // whatif and explain say that the stream was predicted, in their text and their JSON.
    let p = path.to_str().unwrap();
    let w = json(&["whatif", p, "--capacity", "80GiB", "--json"]);
    assert!(w["predicted"].as_str().is_some_and(|s| s.starts_with(PREDICTED_NOTE)), "{}", w["predicted"]);
    let e = json(&["explain", p, "--capacity", "80GiB", "--json"]);
    assert!(e["predicted"].as_str().is_some_and(|s| s.starts_with(PREDICTED_NOTE)), "{}", e["predicted"]);
    for args in [["whatif", p, "--capacity", "80GiB"], ["explain", p, "--capacity", "80GiB"]] {
        let t = text(&args);
        assert!(t.lines().take(4).any(|l| l.starts_with(PREDICTED_NOTE)), "{args:?}:\n{t}");
    }
    // At 40 MiB: the parameters (16.2 MiB in a 16 MiB and a 2 MiB segment), the input (1 MiB, in
    // the small segment) and the first Linear's output (4 MiB in a 20 MiB segment) are 38 MiB
    // reserved when the first product asks for its 32 MiB cuBLAS workspace: explain names it.
    let e = json(&["explain", p, "--capacity", "40MiB", "--json"]);
    assert_eq!(e["figures"]["requested_bytes"], 32 << 20);
    assert_eq!(
        e["predicted_where"],
        "iteration 0, forward, cuBLAS workspace (main thread, stream 0) (aten.addmm.default)"
    );
    // A recorded snapshot is not predicted.
    let plain = fixture("seed_experiments.max24.pickle");
    let w = json(&["whatif", plain.to_str().unwrap(), "--json"]);
    assert!(w["predicted"].is_null(), "{}", w["predicted"]);
    let e = json(&["explain", plain.to_str().unwrap(), "--json"]);
    assert!(e["predicted"].is_null() && e["predicted_where"].is_null());
    assert_eq!(PREDICTED_KEY, "alloctrace_predicted", "the key python/alloctrace/predict.py writes");
}

/// The predicted peaks (the recorded settings' replay of the predicted stream) against real
/// H100 runs of the same steps (`predict_vs_real.tsv`). The targets: allocated within 2% (the
/// estimators' own tests accept 10%), reserved within 3%. ResNet's reserved memory is printed,
/// not held to the target: its convolutions' cuDNN workspaces are not predicted (cuDNN picks
/// them at run time) and the prediction's note says so for new predictions.
#[test]
fn predictions_against_real_h100_runs() {
    let tsv = std::fs::read_to_string(fixture("predicted/predict_vs_real.tsv")).unwrap();
    println!(
        "{:<14} {:>5} {:>14} {:>14} {:>8} {:>14} {:>14} {:>8}",
        "model", "batch", "pred alloc", "real alloc", "err", "pred reserved", "real reserved", "err"
    );
    let mut checked = 0;
    for line in tsv.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        let (model, batch) = (f[0], f[1]);
        let (real_alloc, real_reserved): (f64, f64) = (f[3].parse().unwrap(), f[6].parse().unwrap());
        let name = format!("predicted/{model}_b{batch}.pickle");
        if !fixture(&name).exists() {
            continue;
        }
        let w = json(&["whatif", fixture(&name).to_str().unwrap(), "--json"]);
        let row = w["rows"].as_array().unwrap().iter().find(|r| r["policy"] == "recorded").unwrap();
        let pa = row["peak_allocated_bytes"].as_u64().unwrap() as f64;
        let pr = row["peak_reserved_bytes"].as_u64().unwrap() as f64;
        let (ea, er) = (100.0 * (pa - real_alloc) / real_alloc, 100.0 * (pr - real_reserved) / real_reserved);
        println!(
            "{model:<14} {batch:>5} {pa:>14} {real_alloc:>14} {ea:>+7.2}% {pr:>14} {real_reserved:>14} {er:>+7.2}%"
        );
        assert!(ea.abs() <= 2.0, "{model} batch {batch}: predicted allocated {pa} vs real {real_alloc}");
        if !model.starts_with("resnet") {
            assert!(er.abs() <= 3.0, "{model} batch {batch}: predicted reserved {pr} vs real {real_reserved}");
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "the two training fixtures");
}
