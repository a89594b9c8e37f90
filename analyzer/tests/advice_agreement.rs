//! One decision per setting, rendered everywhere: on every shipped trace and snapshot, at three
//! capacities around its unlimited peak, the what-if rows, `explain`'s advice and worth-trying
//! list, its not-advised lines, its fix (JSON and text) and the report's fix line all say the
//! same thing of each setting.
//!
//! - where the recorded settings run out of memory at the capacity, a row decided `fits` (the
//!   whole job is in the trace and completes there) is advised as a setting, and only such rows
//!   are;
//! - there too, a row decided `worth_trying` (the trace stops at the failure and the replay
//!   serves the request that failed, or the replay goes through once the cuDNN workspaces that
//!   fail are left out) is listed as worth trying, and only such rows are; neither kind is ever
//!   advised as fitting or named as not advised;
//! - the fix is the first proven advice, else the first setting worth trying whose whole job is
//!   not predicted to run out of memory at the limit, else the advice on memory, else the first
//!   setting worth trying; the text and the report's fix line show that fix.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(args: &[&str]) -> std::process::Output {
    let o = Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().expect("run alloctrace");
    assert!(o.status.code().is_some_and(|c| c == 0 || c == 3), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

fn json(args: &[&str]) -> Value {
    let o = run(args);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

/// The shipped traces (not the large one: three capacities of it would take minutes) and the
/// real snapshots.
fn inputs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for (dir, ext) in [(root().join("traces"), "atrace"), (root().join("analyzer/tests/fixtures/torch"), "pickle")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == ext) {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

/// Words, whitespace collapsed: wrapped text compared with the JSON's.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn env_setting(alloc_conf: &str) -> String {
    format!("PYTORCH_CUDA_ALLOC_CONF={alloc_conf}")
}

fn check(name: &str, input: &str, cap: u64, with_report: bool) {
    let c = cap.to_string();
    let x = json(&["explain", "--json", input, "--capacity", &c]);
    let w = json(&["whatif", "--json", "--no-search", input, "--capacity", &c]);
    let at = format!("{name} at {c}");
    // The what-if table's decisions are explain's.
    let decisions = |rows: &Value| -> Vec<(String, String)> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| (r["policy"].as_str().unwrap().to_string(), r["decision"].as_str().unwrap().to_string()))
            .collect()
    };
    assert_eq!(decisions(&x["whatif"]), decisions(&w["rows"]), "{at}: whatif and explain decide alike");
    let advised: Vec<String> = x["advice"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "setting")
        .filter_map(|a| a["setting"].as_str().map(str::to_string))
        .collect();
    let worth: Vec<String> =
        x["worth_trying"].as_array().unwrap().iter().map(|t| t["setting"].as_str().unwrap().to_string()).collect();
    let not_advised: Vec<String> =
        x["not_advised"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    for r in x["whatif"].as_array().unwrap() {
        let policy = r["policy"].as_str().unwrap();
        let setting = env_setting(r["alloc_conf"].as_str().unwrap());
        let decision = r["decision"].as_str().unwrap();
        let named_not_advised =
            not_advised.iter().any(|n| n.split(": ").next().unwrap_or("").split(", ").any(|p| p.starts_with(policy)));
        match decision {
            // Settings are advised where the recorded ones run out of memory at the capacity.
            "fits" if x["moment"] == "oom" => {
                assert!(advised.contains(&setting), "{at}: {policy} fits but is not advised: {advised:?}");
                assert!(!named_not_advised, "{at}: {policy} fits but is named not advised: {not_advised:?}");
            }
            // Named worth trying where the recorded settings run out of memory at the capacity.
            "worth_trying" => {
                if x["moment"] == "oom" {
                    assert!(worth.contains(&setting), "{at}: {policy} may get through but is not worth trying");
                }
                assert!(!advised.contains(&setting), "{at}: {policy} is advised though the rest of the job is unknown");
                assert!(!named_not_advised, "{at}: {policy} gets past the failure but is named not advised");
            }
            "fits" => {}
            // The limit was inferred, and the setting gets past the failure only inside the
            // range the trace allows: worth trying, never ruled out.
            "limit_decides" => {
                assert!(worth.contains(&setting), "{at}: {policy} gets past inside the range but is not worth trying");
                assert!(!advised.contains(&setting), "{at}: {policy} is advised though the limit decides");
                assert!(!named_not_advised, "{at}: {policy} gets past inside the range but is named not advised");
            }
            _ => {
                assert!(!advised.contains(&setting), "{at}: {policy} is advised but decided {decision}");
                assert!(!worth.contains(&setting), "{at}: {policy} is worth trying but decided {decision}");
                // The trace cannot tell: neither advised nor ruled out (it was "not advised").
                if decision == "cannot_tell" {
                    assert!(!named_not_advised, "{at}: {policy} cannot be told but is named not advised");
                }
            }
        }
        // The setting the advice builds on is never also named not advised.
        let named_by_advice = x["advice"].as_array().unwrap().iter().any(|a| a["setting"] == setting.as_str());
        assert!(!(named_by_advice && named_not_advised), "{at}: {policy} is advised and named not advised");
    }
    more_memory_agrees_with_the_search(&x, cap, &at);
    nothing_is_proven_past_the_end(&x, &at);
    // The fix: the first proven advice, else the first setting worth trying whose whole job is
    // not predicted over the limit, else the advice on memory, else the first worth trying.
    let proven = x["advice"].as_array().unwrap().iter().find(|a| a["proven"] == true);
    let fix = &x["fix"];
    let worth_rows = x["worth_trying"].as_array().unwrap();
    let within = worth_rows.iter().find(|w| w["predicted_over_limit"] == false).and_then(|w| w["setting"].as_str());
    let memory =
        x["advice"].as_array().unwrap().iter().find(|a| a["kind"] == "capacity").filter(|_| !worth_rows.is_empty());
    match (proven, within, memory, worth.first().map(String::as_str)) {
        (Some(a), ..) => {
            assert_eq!(fix["strength"], "proven", "{at}");
            assert_eq!(fix["text"], a["text"], "{at}: the fix is the first proven advice");
        }
        (None, Some(s), ..) | (None, None, None, Some(s)) => {
            assert_eq!(fix["strength"], "worth_trying", "{at}");
            assert_eq!(fix["setting"].as_str(), Some(s), "{at}: the fix is the first setting worth trying");
        }
        (None, None, Some(a), _) => {
            assert_eq!(fix["strength"], "unproven", "{at}");
            assert_eq!(fix["text"], a["text"], "{at}: the fix is the advice on memory");
        }
        (None, None, None, None) => assert!(fix.is_null() || fix["strength"] == "unproven", "{at}: {fix}"),
    }
    // The text shows the same fix, on one screen.
    let text = String::from_utf8_lossy(&run(&["explain", input, "--capacity", &c]).stdout).into_owned();
    if let Some(t) = fix["text"].as_str() {
        assert!(words(&text).contains(&words(t)), "{at}: the text does not show the fix {t:?}:\n{text}");
    }
    assert!(text.lines().count() <= 40, "{at}: explain's text is {} lines:\n{text}", text.lines().count());
    // The report's fix line is that fix.
    if with_report {
        let dir = std::env::temp_dir().join(format!("alloctrace-advice-{}-{name}-{c}", std::process::id()));
        let s = json(&["report", "--json", input, "--capacity", &c, "-o", dir.to_str().unwrap(), "--force"]);
        assert_eq!(s["explain"]["fix"], x["fix"], "{at}: summary.json's fix");
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        // The fix paragraph (wrapped), as Markdown renders it: its backslash escapes dropped.
        let start = md.lines().position(|l| {
            l.starts_with("**Fix:**") || l.starts_with("**Worth trying first:**") || l.starts_with("**Suggestion:**")
        });
        let line = start.map(|k| {
            md.lines().skip(k).take_while(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" ").replace('\\', "")
        });
        let line = line.as_deref();
        match fix["text"].as_str() {
            Some(t) => {
                let line = line.unwrap_or_else(|| panic!("{at}: report.md has no fix line"));
                assert!(words(line).contains(&words(t)), "{at}: report fix {line:?} is not {t:?}");
                assert!(!line.contains("PYTORCH_CUDA_ALLOC_CONF=PYTORCH_CUDA_ALLOC_CONF"), "{at}: {line}");
            }
            None => assert!(line.is_some_and(|l| l.contains("none")), "{at}: {line:?}"),
        }
        report_oom_finding_agrees(&md, &x, &w, cap, &at);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// More memory is advised only where the capacity search found no smaller limit at which the
/// recorded settings get through: where it found one at or below the limit that failed, the
/// advice says that more memory is no sure fix.
fn more_memory_agrees_with_the_search(x: &Value, cap: u64, at: &str) {
    let recorded = x["whatif"].as_array().unwrap().iter().find(|r| r["policy"] == "recorded").unwrap();
    let below = recorded["min_capacity_bytes"].as_u64().is_some_and(|m| m <= cap);
    for a in x["advice"].as_array().unwrap().iter().filter(|a| a["kind"] == "capacity") {
        let text = a["text"].as_str().unwrap();
        assert_eq!(text.starts_with("more memory is no sure fix"), below, "{at}: {text} (recorded row {recorded})");
        if below {
            assert_ne!(a["proven"], true, "{at}: {text}");
        }
    }
}

/// The report's out-of-memory finding names a setting under "completes" only where its what-if
/// row completes the whole job, and under "gets past" only where its row gets past the failure.
fn report_oom_finding_agrees(md: &str, x: &Value, w: &Value, capacity: u64, at: &str) {
    let md = words(md);
    let listed = |phrase: &str, end: &str| -> Vec<String> {
        let Some(k) = md.find(phrase) else { return Vec::new() };
        let rest = &md[k + phrase.len()..];
        let rest = &rest[..rest.find(end).unwrap_or(rest.len())];
        rest.split('`').skip(1).step_by(2).map(str::to_string).collect()
    };
    let reach = |conf: &str| -> String {
        if conf.starts_with("PYTORCH_NO_CUDA_MEMORY_CACHING=1") {
            // Without caching every request is a device allocation of its own: the run gets
            // through exactly where that peak fits.
            let fits = w["bounds"]["no_caching_peak_bytes"].as_u64().unwrap() <= capacity;
            let stops_at_failure = !w["prediction"].is_null();
            return match (fits, stops_at_failure) {
                (true, false) => "completes",
                (true, true) => "gets_past_failure",
                (false, _) => "oom",
            }
            .to_string();
        }
        let row = x["whatif"].as_array().unwrap().iter().find(|r| r["alloc_conf"] == conf);
        row.map(|r| r["reach"].as_str().unwrap().to_string()).unwrap_or_else(|| panic!("{at}: no row {conf}"))
    };
    for conf in listed("Under this limit the whole job, replayed, completes with ", ". ") {
        assert_eq!(reach(&conf), "completes", "{at}: the report says {conf} completes the job");
    }
    for conf in listed("Under this limit the replay gets past the request that failed with ", "; the rest") {
        assert_eq!(reach(&conf), "gets_past_failure", "{at}: the report says {conf} gets past the failure");
    }
}

/// On a trace that stops at the failure, no advice is proven: a replay that serves every
/// request gets past the failure, and the rest of the job is not in the trace.
fn nothing_is_proven_past_the_end(x: &Value, at: &str) {
    let stops_at_failure = x["whatif"].as_array().unwrap().iter().any(|r| {
        ["fails_where_recorded", "fails_earlier", "gets_past_failure"].contains(&r["reach"].as_str().unwrap())
    });
    if stops_at_failure {
        for a in x["advice"].as_array().unwrap() {
            assert_ne!(a["proven"], true, "{at}: proven on a trace that stops at the failure: {a}");
        }
        assert_ne!(x["fix"]["strength"], "proven", "{at}: {}", x["fix"]);
        for e in x["experiments"].as_array().unwrap().iter().filter(|e| e["completes"] == true) {
            assert_eq!(e["reach"], "gets_past_failure", "{at}: {e}");
        }
    }
}

/// A third-party job's snapshot taken at the failure, where reordering the kept tensors gets
/// the run past it: that change is advised, unproven.
#[test]
fn a_code_change_is_not_proven_on_a_snapshot_that_stops_at_the_failure() {
    let p = root().join("tests/fixtures/doctor/tv_resnet_varbatch.2509242368.pickle");
    let x = json(&["explain", "--json", p.to_str().unwrap(), "--capacity", "2509242368"]);
    let code = x["advice"].as_array().unwrap().iter().find(|a| a["kind"] == "code").expect("a code change");
    assert!(code["evidence"].as_str().unwrap().contains("gets past the request that failed"), "{code}");
    nothing_is_proven_past_the_end(&x, "tv_resnet_varbatch");
}

/// The large real trace: at the limit it inferred, the recorded settings fail, and the search
/// finds them getting past at a smaller one.
#[test]
fn more_memory_is_no_sure_fix_where_a_smaller_limit_gets_through() {
    let t = root().join("traces/large/mixed_sizes_big.default.atrace");
    let x = json(&["explain", "--json", t.to_str().unwrap()]);
    let cap = x["capacity_bytes"].as_u64().unwrap();
    assert_eq!(x["moment"], "oom");
    assert!(x["advice"].as_array().unwrap().iter().any(|a| a["kind"] == "capacity"), "{}", x["advice"]);
    more_memory_agrees_with_the_search(&x, cap, "the large trace");
    let text = String::from_utf8_lossy(&run(&["explain", t.to_str().unwrap()]).stdout).into_owned();
    assert!(words(&text).contains("more memory is no sure fix"), "{text}");
    assert!(!text.contains("with more memory than"), "{text}");
}

#[test]
fn advice_whatif_report_and_json_agree_at_three_capacities() {
    for input in inputs() {
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        let p = input.to_str().unwrap();
        // `replay` reads traces: a snapshot is imported for it.
        let imported = std::env::temp_dir().join(format!("alloctrace-advice-{}-{name}.atrace", std::process::id()));
        let traced = if p.ends_with(".pickle") {
            run(&["import", "torch", p, "-o", imported.to_str().unwrap()]);
            imported.to_str().unwrap()
        } else {
            p
        };
        let unlimited = json(&["replay", "--json", "--unlimited", traced]);
        let _ = std::fs::remove_file(&imported);
        let peak = unlimited["peak_reserved_bytes"].as_u64().unwrap();
        for (k, f) in [0.9, 1.0, 1.1].into_iter().enumerate() {
            let cap = ((peak as f64 * f) as u64 >> 20 << 20).max(1 << 20);
            check(&name, p, cap, k != 2);
        }
    }
}

/// Where the advice gives more memory with a setting, that setting is not also "not advised"
/// (gpt2_train at 5 GiB: "give the process 5.50 GiB ... with max_split_size_mb:64", then "not
/// advised: ..., max_split_size_mb:64, ..."); and a setting whose replay fails where the program
/// may have caught the failure is "cannot tell", not "not advised" (amp_adamw at its inferred
/// limit: expandable segments completed in PyTorch at the real one, `truth.tsv`).
#[test]
fn advice_names_no_setting_both_ways() {
    let gpt2 = root().join("traces/gpt2_train.default.atrace");
    check("gpt2_train.default", gpt2.to_str().unwrap(), 5 << 30, true);
    let amp = root().join("tests/fixtures/truth/amp_adamw.default.1.00.pickle");
    let amp = amp.to_str().unwrap();
    check("amp_adamw.default.1.00", amp, 1_117_782_016, false);
    let x = json(&["explain", "--json", amp]);
    let cannot: Vec<&str> = x["cannot_tell"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(cannot.iter().any(|n| n.starts_with("expandable_segments:True")), "{cannot:?}");
    assert!(!x["not_advised"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("expandable")));
}

/// A setting to try is never an empty `PYTORCH_CUDA_ALLOC_CONF=`: where a run recorded with
/// expandable segments would do better without them, the setting is named
/// (`expandable_segments:False`), as the what-if row is.
#[test]
fn a_setting_to_try_is_never_empty() {
    let own = root().join("tests/fixtures/truth/own");
    let mut named = 0;
    for name in ["two_streams.expandable.1.00.atrace", "empty_cache_loop.expandable.1.00.atrace"] {
        let p = own.join(name);
        let x = json(&["explain", "--json", p.to_str().unwrap()]);
        let mut settings: Vec<String> = x["worth_trying"]
            .as_array()
            .unwrap()
            .iter()
            .chain(x["advice"].as_array().unwrap())
            .filter_map(|a| a["setting"].as_str().map(str::to_string))
            .collect();
        settings.extend(x["fix"]["setting"].as_str().map(str::to_string));
        for s in &settings {
            assert_ne!(s, "PYTORCH_CUDA_ALLOC_CONF=", "{name}: {settings:?}");
        }
        named += settings.iter().filter(|s| s.ends_with("expandable_segments:False")).count();
    }
    assert!(named > 0, "the fixtures have a setting that turns expandable segments off");
}
