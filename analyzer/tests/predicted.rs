//! Predicted request streams (`alloctrace.predict`, `fixtures/predicted/`, see its README): the
//! importer reads them as predicted, every command says so, and their peaks are compared with
//! real H100 runs of the same steps.

use analyzer::source::import::torch::{PREDICTED_KEY, PREDICTED_NOTE};
use analyzer::source::import::{import_file, ImportOptions};
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

/// The rows of a fixture table with a header line, as (column -> field) maps.
fn table(name: &str) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let mut lines = text.lines();
    let head: Vec<String> = lines.next().unwrap().split('\t').map(str::to_string).collect();
    lines.map(|l| head.iter().cloned().zip(l.split('\t').map(str::to_string)).collect()).collect()
}

fn num(row: &std::collections::HashMap<String, String>, key: &str) -> f64 {
    row[key].parse().unwrap_or_else(|e| panic!("{key} = {:?}: {e}", row[key]))
}

fn measured(model: &str, batch: &str) -> String {
    fixture(&format!("predicted/measured/{model}_b{batch}.pickle")).to_str().unwrap().to_string()
}

/// Will it fit, on four third-party models against real H100 runs (`willitfit_*.tsv`, made by
/// `python/gpu/willitfit.py`, see the fixtures' README): the predicted peaks (replayed here from
/// the predicted snapshots) and MemTracker's estimate against the real peaks; the predicted
/// outcome at 0.9x, 1.0x and 1.1x the real peak reserved under five settings against the real
/// outcome; the predicted largest batch against the real one.
///
/// The snapshots were predicted on the H100 host, so every operator's kernel scratch (cuDNN
/// workspaces, fused attention, reduction buffers) was measured there and nothing is left out:
/// no prediction is a lower bound, and `whatif` says "fits". The targets, asserted:
/// allocated within 2% of the real peak on every row (and closer than MemTracker); reserved
/// within 3% on every row; the outcome agrees with the real one in at least 95% of the runs;
/// the largest batch past cuDNN's fallbacks is the real one or one below, never above. Every
/// answer that disagrees is printed, with the way it is wrong: a "fits" where the real run ran
/// out of memory, or a "does not fit" where it completed. (The one disagreement, ViT-B/16 at
/// batch 32 under `garbage_collection_threshold:0.6` at exactly its real peak reserved, is a
/// "does not fit" where the real run completed 6 MiB under the limit.)
#[test]
fn will_it_fit_on_four_models_against_real_h100_runs() {
    // Peaks.
    println!(
        "{:<13} {:>5} {:>13} {:>13} {:>7} {:>8} {:>13} {:>13} {:>7}",
        "model", "batch", "pred alloc", "real alloc", "err", "MemTr.", "pred reserv", "real reserv", "err"
    );
    let peaks = table("predicted/willitfit_peaks.tsv");
    assert_eq!(peaks.len(), 12, "four models, three batches each");
    for r in &peaks {
        let (model, batch) = (r["model"].as_str(), r["batch"].as_str());
        let w = json(&["whatif", &measured(model, batch), "--json", "--no-search"]);
        let row = w["rows"].as_array().unwrap().iter().find(|r| r["policy"] == "recorded").unwrap();
        let pa = row["peak_allocated_bytes"].as_u64().unwrap() as f64;
        let pr = row["peak_reserved_bytes"].as_u64().unwrap() as f64;
        let (ra, rr, mt) = (num(r, "real_alloc"), num(r, "real_reserved"), num(r, "memtracker"));
        let (ea, er, em) = (100.0 * (pa - ra) / ra, 100.0 * (pr - rr) / rr, 100.0 * (mt - ra) / ra);
        println!("{model:<13} {batch:>5} {pa:>13} {ra:>13} {ea:>+6.2}% {em:>+7.2}% {pr:>13} {rr:>13} {er:>+6.2}%");
        // Every operator's scratch was measured: nothing is left out, so no lower bound.
        assert!(!w["lower_bound"].as_bool().unwrap(), "{model}: {}", w["predicted"]);
        assert!(ea.abs() <= 2.0, "{model} batch {batch}: allocated {ea:+.2}%");
        // MemTracker counts no allocator (no workspaces, no scratch, no rounding).
        assert!(ea.abs() < em.abs(), "{model} batch {batch}: {ea:+.2}% vs MemTracker {em:+.2}%");
        assert!(er.abs() <= 3.0, "{model} batch {batch}: reserved {er:+.2}%");
    }

    // Outcomes at limits.
    let outcomes = table("predicted/willitfit_outcomes.tsv");
    let mut replays = std::collections::HashMap::new();
    let mut agree = 0;
    let mut said: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    let mut per_model: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    for r in &outcomes {
        let (model, batch, limit) = (r["model"].as_str(), r["batch"].as_str(), r["limit"].as_str());
        let w = replays.entry((model, batch, limit)).or_insert_with(|| {
            json(&["whatif", &measured(model, batch), "--capacity", limit, "--json", "--no-search"])
        });
        let policy = if r["setting"] == "default" { "recorded" } else { r["setting"].as_str() };
        let row = w["rows"].as_array().unwrap().iter().find(|x| x["policy"] == policy).unwrap();
        let completes = row["reach"] == "completes";
        let real_completes = r["real"] == "completes";
        // The recorded settings' row is what the others are compared with; its reach says.
        let decision = match row["decision"].as_str().unwrap() {
            "recorded" if completes => "fits".to_string(),
            "recorded" => "does_not_fit".to_string(),
            d => d.to_string(),
        };
        let right = match decision.as_str() {
            "fits" => real_completes,
            "cannot_tell" => true,
            _ => !real_completes,
        };
        let s = said.entry(decision.clone()).or_default();
        s.0 += 1;
        s.1 += u32::from(right);
        let e = per_model.entry(model.to_string()).or_default();
        e.1 += 1;
        if completes == real_completes {
            agree += 1;
            e.0 += 1;
        } else {
            println!(
                "disagrees: {model} batch {batch} at {}x under {policy}: replay {}, real run {} ({decision})",
                r["fraction"],
                if completes { "completes" } else { "runs out" },
                if real_completes { "completed" } else { "ran out" },
            );
        }
    }
    for (m, (a, n)) in &per_model {
        println!("outcomes {m:<13} {a}/{n} agree");
    }
    let n = outcomes.len();
    println!("outcomes: {agree}/{n} agree ({:.1}%)", 100.0 * agree as f64 / n as f64);
    for (d, (k, right)) in &said {
        println!("  said {d:<12} {k:>3} times, right {right}");
    }
    assert_eq!(n, 180, "every model, batch, limit and setting");
    assert!(agree as f64 >= 0.95 * n as f64, "{agree}/{n}");
    let (k, _) = said.get("does_not_fit").copied().unwrap_or_default();
    assert!(k > 0, "no limit under which the prediction says 'does not fit'");

    // The largest batch: the largest that completes, and the largest that completes once the
    // cuDNN workspaces that fail at the capacity are left out (cuDNN then tries another plan).
    for r in table("predicted/willitfit_largest.tsv") {
        let (model, pred) = (r["model"].as_str(), num(&r, "pred_largest") as u64);
        let past = num(&r, "pred_past_cudnn_fallback") as u64;
        let real: u64 = r["real_largest"].parse().unwrap_or_else(|_| panic!("{model}: the real search finished"));
        println!(
            "largest {model:<13} at {} bytes: predicted {pred} ({:+}), {past} past cuDNN's fallbacks ({:+}), real {real} ({})",
            r["capacity"],
            pred as i64 - real as i64,
            past as i64 - real as i64,
            r["real_probes"]
        );
        assert_eq!(r["upper_bound"], "False", "{model}: {}", r["not_modelled"]);
        assert!(pred <= past, "{model}: {pred} completes, so it completes past the fallbacks");
        // The target, met by the second figure: the real largest or one below, never above.
        assert!(past <= real && past + 1 >= real, "{model}: {past} past the fallbacks, real {real}");
    }
}

/// ResNet-18 at batch 64, recorded for real on the H100 (`probe_check.py --record-model`), and
/// predicted on CPU with the kernels' scratch probed: the two request streams are the same,
/// request for request (sizes and order), so the prediction's reserved error there comes from
/// the replay, not the stream. Replayed at the real run's segment addresses, the real stream
/// ends at the real peak reserved. The predicted stream has no addresses: the engine's device
/// places its segments by the driver's rule (`recorder/src/device/placement.rs`), and best
/// fit's ties between equal blocks break as in the real run, to the same peak. (Placed first fit
/// upward from a fixed base, as before that rule, it peaked 3.7% under.)
#[test]
fn the_predicted_resnet_stream_is_the_real_runs_requests() {
    // Each request: Some(bytes) for an allocation, None for a free, in order.
    let requests = |name: &str| -> Vec<Option<u64>> {
        let imported = import_file(&fixture(name), &ImportOptions::default()).unwrap();
        imported
            .records
            .iter()
            .filter_map(|r| match &r.event {
                Event::Alloc { requested_bytes, .. } => Some(Some(*requested_bytes)),
                Event::FreeRequested { .. } => Some(None),
                _ => None,
            })
            .collect()
    };
    let real = requests("predicted/measured/resnet18_sgd_b64.real.pickle");
    let predicted = requests("predicted/measured/resnet18_sgd_b64.pickle");
    // The prediction also frees what the process still holds when it ends.
    assert!(predicted.len() > real.len());
    assert_eq!(&predicted[..real.len()], &real[..], "the same requests in the same order");

    let peak = |args: &[&str]| {
        let w = json(&[&["whatif"], args, &["--json", "--no-search"]].concat());
        let row = w["rows"].as_array().unwrap().iter().find(|r| r["policy"] == "recorded").unwrap().clone();
        row["peak_reserved_bytes"].as_u64().unwrap()
    };
    let real_path = fixture("predicted/measured/resnet18_sgd_b64.real.pickle");
    let real_peak = 2_808_086_528; // max_memory_reserved() of the recorded run (willitfit_peaks.tsv)
    let replayed = json(&["replay", real_path.to_str().unwrap(), "--json"]);
    assert_eq!(replayed["peak_reserved_bytes"].as_u64(), Some(real_peak), "{replayed}");
    let own = peak(&[&measured("resnet18_sgd", "64")]);
    println!("real {real_peak}, real stream at the real addresses {real_peak}, predicted stream {own}");
    assert_eq!(own, real_peak);
}

/// The capacity search on predicted streams whose floor (the blocks live at once) is replayed
/// first: its band can hold the unlimited run's peak, which then needs no replay of its own (the
/// search once looked that capacity up among the replayed ones only, and `whatif` panicked on
/// these three). Each row's smallest capacity completes when replayed, and the limit one step
/// below it does not.
#[test]
fn the_capacity_search_ends_on_predicted_streams() {
    for (model, batch) in [("gpt2_adamw", "8"), ("gpt2_adamw", "16"), ("resnet18_sgd", "32")] {
        let path = measured(model, batch);
        let w = json(&["whatif", &path, "--json"]);
        for row in w["rows"].as_array().unwrap() {
            let (Some(min), Some(step)) =
                (row["min_capacity_bytes"].as_u64(), row["min_capacity_resolution_bytes"].as_u64())
            else {
                panic!("{model} {batch}: {} has no smallest capacity", row["policy"]);
            };
            let conf = row["alloc_conf"].as_str().unwrap();
            let completes = |cap: u64| {
                let r = json(&["replay", &path, "--conf", conf, "--capacity", &cap.to_string(), "--json"]);
                r["outcome"] == "ok"
            };
            assert!(completes(min), "{model} {batch} {conf}: {min} does not complete");
            assert!(!completes(min - step), "{model} {batch} {conf}: {} completes", min - step);
        }
    }
}
