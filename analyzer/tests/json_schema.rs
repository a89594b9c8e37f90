//! docs/json-schema.md names every key the `--json` outputs emit: this runs each command that has
//! one (and `report`, whose `summary.json` it reads) on a few small shipped traces and snapshots,
//! collects every object key found anywhere in the JSON (nested objects and the elements of
//! lists too), and fails listing each key that the document does not give as `key` (in
//! backticks), with the commands that emitted it. A new key is documented, or this fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Objects whose keys are data rather than names (a map keyed by stream or by call site would
/// be one), given by the key that holds them: their keys are not looked for in the document,
/// their values still are. None exists today: `events_by_kind` and the objects of bytes by
/// category have fixed keys (the trace format's event kinds, the categories), which the
/// document lists.
const DATA_KEYED: &[&str] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One run: its arguments (paths relative to the repository root, where it runs), and where its
/// JSON is: stdout (`--json`), or a file it writes.
struct Run {
    args: Vec<String>,
    json_file: Option<PathBuf>,
}

impl Run {
    fn stdout(args: &[&str]) -> Run {
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push("--json".into());
        Run { args, json_file: None }
    }

    /// `report`: its `summary.json` in the folder `dir`.
    fn report(inputs: &[&str], dir: &Path, extra: &[&str]) -> Run {
        let mut args = vec!["report".to_string()];
        args.extend(inputs.iter().map(|a| a.to_string()));
        args.extend(["-o".to_string(), dir.display().to_string()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        Run { args, json_file: Some(dir.join("summary.json")) }
    }

    fn name(&self) -> String {
        self.args.join(" ")
    }

    fn json(&self) -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
            .args(&self.args)
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.name()));
        assert!(o.status.success(), "{}: exit {:?}: {}", self.name(), o.status, String::from_utf8_lossy(&o.stderr));
        let bytes = match &self.json_file {
            Some(f) => std::fs::read(f).unwrap_or_else(|e| panic!("{}: {}: {e}", self.name(), f.display())),
            None => o.stdout,
        };
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: not JSON: {e}", self.name()))
    }
}

/// Every object key under `v`, whatever its depth, but the keys of [`DATA_KEYED`] objects.
fn keys(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match x {
                    serde_json::Value::Object(inner) if DATA_KEYED.contains(&k.as_str()) => {
                        inner.values().for_each(|y| keys(y, out))
                    }
                    _ => keys(x, out),
                }
                out.insert(k.clone());
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
        _ => {}
    }
}

#[test]
fn every_emitted_json_key_is_documented() {
    let doc = std::fs::read_to_string(root().join("docs/json-schema.md")).expect("docs/json-schema.md");
    let tmp = std::env::temp_dir().join(format!("alloctrace-json-schema-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let out = |name: &str| tmp.join(name).display().to_string();

    let frag = "traces/frag_oom.default.atrace";
    let gpt2 = "traces/gpt2_train.default.atrace";
    let leak = "traces/leak_list_append.default.atrace";
    // Private pools (CUDA graphs), `empty_cache()` calls, and most event kinds.
    let pools = "traces/recorded_graph_pools.atrace";
    let expandable = "traces/recorded_rust_workload_expandable.atrace";
    let snapshot = "analyzer/tests/fixtures/torch/frag_oom.default.pickle";
    // An OOM without a recorded limit (`verdict_by_limit`) whose job is predicted from a
    // repeated iteration (`prediction`'s policies).
    let doctor = "tests/fixtures/doctor/hf_trainer.4994367488.pickle";
    let rank0 = "analyzer/tests/fixtures/ranks/ddp_rank0.pickle";
    let rank1 = "analyzer/tests/fixtures/ranks/ddp_rank1.pickle";
    let (svg, atrace, synth, perfetto, memviz) =
        (out("plot.svg"), out("import.atrace"), out("synth.atrace"), out("perfetto.json"), out("memviz.pickle"));
    let runs = [
        Run::stdout(&["summary", gpt2]),
        Run::stdout(&["summary", pools]),
        Run::stdout(&["summary", expandable]),
        Run::stdout(&["summary", snapshot]),
        Run::stdout(&["replay", frag]),
        Run::stdout(&["replay", gpt2, "--capacity", "1GiB"]),
        Run::stdout(&["whatif", frag]),
        Run::stdout(&["whatif", gpt2, "--no-search"]),
        Run::stdout(&["whatif", snapshot, "--no-search", "--capacity", "1GiB"]),
        Run::stdout(&["explain", frag]),
        Run::stdout(&["explain", gpt2]),
        Run::stdout(&["explain", leak]),
        Run::stdout(&["explain", pools]),
        Run::stdout(&["explain", snapshot]),
        Run::stdout(&["explain", doctor]),
        Run::stdout(&["frag", frag]),
        Run::stdout(&["frag", pools]),
        Run::stdout(&["leaks", leak]),
        Run::stdout(&["leaks", gpt2]),
        Run::stdout(&["diff", frag, "traces/frag_oom.expandable.atrace"]),
        Run::stdout(&["ranks", rank0, rank1]),
        Run::stdout(&["plot", frag, "-o", &svg]),
        Run::stdout(&["import", "torch", snapshot, "-o", &atrace]),
        Run::stdout(&["synth", "--events", "10000", "-o", &synth]),
        Run::stdout(&["export", frag, "--format", "perfetto", "-o", &perfetto]),
        Run::stdout(&["export", frag, "--format", "memory-viz", "-o", &memviz]),
        Run::report(&[frag], &tmp.join("report"), &[]),
        Run::report(&[rank0, rank1], &tmp.join("report-ranks"), &["--no-search"]),
    ];

    // The runs at once (the slow ones are single replays of the debug build).
    let found: Vec<(String, BTreeSet<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = runs
            .iter()
            .map(|r| {
                s.spawn(move || {
                    let mut k = BTreeSet::new();
                    keys(&r.json(), &mut k);
                    (r.name(), k)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let _ = std::fs::remove_dir_all(&tmp);

    let mut missing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (run, ks) in &found {
        assert!(ks.contains("schema_version") && ks.len() > 3, "{run}: too few keys: {ks:?}");
        for k in ks.iter().filter(|k| !doc.contains(&format!("`{k}`"))) {
            missing.entry(k).or_default().push(run);
        }
    }
    let all: BTreeSet<&String> = found.iter().flat_map(|(_, k)| k).collect();
    assert!(all.len() > 250, "only {} distinct keys: did a run lose its JSON?", all.len());
    assert!(
        missing.is_empty(),
        "{} key(s) emitted but not in docs/json-schema.md as `key`:\n{}",
        missing.len(),
        missing.iter().map(|(k, runs)| format!("  `{k}` from: {}", runs.join("; "))).collect::<Vec<_>>().join("\n")
    );
}
