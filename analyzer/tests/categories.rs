//! Categories (parameter, gradient, optimizer state, ...) against the model's own figures on two
//! real GPU workloads (fixtures/ranks, see its README): a transformer with AdamW and a CNN with
//! SGD and momentum. Each category's most live bytes must equal the model's figure up to the
//! allocator's rounding (each tensor rounded up to 512 bytes).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ranks").join(name)
}

fn run_json(args: &[&str]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn categories_of(workload: &str) -> (Value, Value) {
    let dir = std::env::temp_dir().join(format!("alloctrace-categories-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{workload}.atrace"));
    let snap = fixture(&format!("{workload}.pickle"));
    run_json(&["import", "torch", snap.to_str().unwrap(), "-o", out.to_str().unwrap(), "--json"]);
    let summary = run_json(&["summary", out.to_str().unwrap(), "--json"]);
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("{workload}.json"))).unwrap()).unwrap();
    (summary["categories"].clone(), truth)
}

/// `measured` is `truth` rounded up, tensor by tensor, to 512 bytes.
fn assert_within_rounding(what: &str, measured: u64, truth: u64, tensors: u64) {
    assert!(
        measured >= truth && measured - truth <= tensors * 512,
        "{what}: measured {measured}, model {truth} ({tensors} tensors)"
    );
}

fn check(workload: &str) -> Value {
    let (c, t) = categories_of(workload);
    assert_eq!(c["phases_from"], "frames");
    assert_eq!(c["forward_passes"], 3);
    let u = |v: &Value| v.as_u64().unwrap();
    let params = u(&t["parameter_bytes"]);
    let n = u(&t["parameter_tensors"]);
    assert_within_rounding("parameters", u(&c["max"]["parameter"]), params, n);
    assert_within_rounding("gradients", u(&c["max"]["gradient"]), u(&t["gradient_bytes"]), n);
    assert_eq!(u(&t["gradient_bytes"]), params);
    assert_within_rounding(
        "optimizer state",
        u(&c["max"]["optimizer_state"]),
        u(&t["optimizer_state_bytes"]),
        u(&t["optimizer_state_tensors"]),
    );
    // At the peak, the categories add up to the peak of allocated bytes and hold the
    // parameters and the optimizer state (the peak comes after the first step).
    let at = &c["at_peak"];
    assert_eq!(u(&at["parameter"]), u(&c["max"]["parameter"]));
    assert_eq!(u(&at["optimizer_state"]), u(&c["max"]["optimizer_state"]));
    assert!(u(&at["activation"]) > 0);
    c
}

#[test]
fn transformer_with_adamw_matches_the_model() {
    let (_, t) = categories_of("transformer_adamw");
    assert_eq!(t["optimizer_state_bytes"], t["expected_optimizer_state_bytes"], "AdamW: 2 x parameters");
    check("transformer_adamw");
}

#[test]
fn cnn_with_sgd_matches_the_model() {
    let (_, t) = categories_of("cnn_sgd");
    assert_eq!(t["optimizer_state_bytes"], t["parameter_bytes"], "SGD momentum: 1 x parameters");
    check("cnn_sgd");
}

#[test]
fn categories_need_call_sites_or_phase_marks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let s = run_json(&["summary", root.join("frag_oom.default.atrace").to_str().unwrap(), "--json"]);
    assert!(s["categories"].is_null(), "no call sites, no marks: {}", s["categories"]);
    let s = run_json(&["summary", root.join("gpt2_train.default.atrace").to_str().unwrap(), "--json"]);
    let c = &s["categories"];
    assert_eq!(c["phases_from"], "frames");
    // The shipped GPT-2 small run (AdamW): 124,439,808 fp32 parameters, whose sizes are all
    // multiples of 512 bytes, so parameters and gradients are exact and the state twice them.
    let params = 124_439_808u64 * 4;
    assert_eq!(c["max"]["parameter"].as_u64(), Some(params));
    assert_eq!(c["max"]["gradient"].as_u64(), Some(params));
    assert_eq!(c["max"]["optimizer_state"].as_u64(), Some(2 * params));
    // Over time: at most 200 samples in event order; the first highest is the peak, split the same
    // way.
    let samples = c["over_time"].as_array().unwrap();
    assert!(!samples.is_empty() && samples.len() <= 200);
    let events: Vec<u64> = samples.iter().map(|x| x["event"].as_u64().unwrap()).collect();
    assert!(events.windows(2).all(|w| w[0] < w[1]));
    let sum = |b: &Value| b.as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum::<u64>();
    let most = samples.iter().map(|x| sum(&x["bytes"])).max().unwrap();
    let top = samples.iter().find(|x| sum(&x["bytes"]) == most).unwrap();
    assert_eq!(top["event"], c["peak_event"]);
    assert_eq!(top["bytes"], c["at_peak"]);
}
