//! Ground truth from real PyTorch 2.11 runs on an H100 (`tests/fixtures/truth/`, made by
//! `scripts/gpu/truth_run.py`; see the README there).
//!
//! Ten workloads, each run in a fresh process under five allocator settings and six limits (or
//! five), twice (`truth.tsv`, `truth.rerun.tsv`). Two questions:
//! 1. The replay a user gets: each workload's recorded default run (`WORKLOAD.default.atrace`)
//!    replayed under the setting and limit of every row, against what PyTorch did there.
//! 2. The engine alone: every real run's own snapshot (`own/WORKLOAD.SETTING.LEVEL.atrace`, from
//!    the pass in `truth.rerun.tsv`) replayed under its own setting and limit, against that same
//!    run.
//!
//! Where the replay of the default run misses, the cause is shown from the real runs' own
//! snapshots: the program made other requests (a caught OOM, an order that depends on the
//! cache), the driver placed segments elsewhere (asserted: with the run's own addresses the
//! engine gives PyTorch's answer), or two real runs of the same row disagreed.

use analyzer::replay::{replay_file, Outcome, ReplayOptions, ReplayResult};
use analyzer::source::tracefile;
use recorder::engine::config::AllocatorConfig;
use recorder::trace::Event;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/truth")
}

#[derive(Debug, Clone)]
struct Row {
    workload: String,
    policy: String,
    level: String,
    limit: Option<u64>,
    oom: bool,
    peak_reserved: u64,
    peak_allocated: u64,
    retries: u64,
    ooms: u64,
}

impl Row {
    fn name(&self) -> String {
        format!("{} {} {}", self.workload, self.policy, self.level)
    }
    /// PyTorch raised an OOM that the program caught (cuDNN trying a plan with a smaller
    /// workspace; `oom_catch` halving its batch): its later requests depend on the limit.
    fn caught_an_oom(&self) -> bool {
        self.ooms > u64::from(self.oom)
    }
}

fn read_truth(file: &str) -> Vec<Row> {
    let text = std::fs::read_to_string(dir().join(file)).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "workload\tpolicy\tlevel\tlimit_gib\toutcome\tpeak_reserved\tpeak_allocated\tnum_alloc_retries\tnum_ooms"
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Row {
                workload: f[0].into(),
                policy: f[1].into(),
                level: f[2].into(),
                // Limits are whole MiB: exact in f64.
                limit: f[3].parse::<f64>().ok().map(|g| (g * (1u64 << 30) as f64) as u64),
                oom: f[4] == "oom",
                peak_reserved: f[5].parse().unwrap(),
                peak_allocated: f[6].parse().unwrap(),
                retries: f[7].parse().unwrap(),
                ooms: f[8].parse().unwrap(),
            }
        })
        .collect()
}

/// The two passes, row by row (same rows, same limits, same order).
fn truth() -> Vec<(Row, Row)> {
    let (a, b) = (read_truth("truth.tsv"), read_truth("truth.rerun.tsv"));
    assert_eq!(a.len(), 255);
    assert_eq!(a.len(), b.len());
    a.into_iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!((x.name(), x.limit), (y.name(), y.limit));
            (x, y)
        })
        .collect()
}

fn conf(policy: &str) -> AllocatorConfig {
    AllocatorConfig::parse(match policy {
        "default" => "",
        "expandable" => "expandable_segments:True",
        "maxsplit64" => "max_split_size_mb:64",
        "pow2div4" => "roundup_power2_divisions:4",
        "gc06" => "garbage_collection_threshold:0.6",
        other => panic!("unknown policy {other}"),
    })
    .unwrap()
}

fn replay(path: &Path, policy: &str, limit: Option<u64>) -> ReplayResult {
    let opts = ReplayOptions {
        config: Some(conf(policy)),
        capacity_bytes: limit,
        unlimited: limit.is_none(),
        ..Default::default()
    };
    replay_file(path, &opts).unwrap()
}

fn default_trace(workload: &str) -> PathBuf {
    dir().join(format!("{workload}.default.atrace"))
}

fn own_trace(row: &Row) -> PathBuf {
    dir().join("own").join(format!("{}.{}.{}.atrace", row.workload, row.policy, row.level))
}

/// What the program asked for: requests (size, stream in order of first use) and frees, by
/// request number.
fn requests(path: &Path) -> Vec<(u8, u64, u64, usize)> {
    let mut streams: Vec<u64> = Vec::new();
    let mut stream_no = |s: u64| match streams.iter().position(|&x| x == s) {
        Some(i) => i,
        None => {
            streams.push(s);
            streams.len() - 1
        }
    };
    let mut v = Vec::new();
    tracefile::scan(path, |_, r| match r.event {
        Event::Alloc { id, requested_bytes, stream, .. } => v.push((0, id, requested_bytes, stream_no(stream))),
        Event::Oom { requested_bytes, stream, .. } => v.push((1, 0, requested_bytes, stream_no(stream))),
        Event::FreeRequested { id, .. } => v.push((2, id, 0, 0)),
        Event::FreeCompleted { id, .. } => v.push((3, id, 0, 0)),
        _ => {}
    })
    .unwrap();
    // Frees that complete at once and follow each other, with no request between, leave the
    // allocator in one state whatever their order (each returns its block and merges it with
    // its free neighbours): Python may free a batch of tensors in another order from one run
    // to the next. Each such batch is taken in the order of its ids.
    let mut i = 0;
    while i < v.len() {
        let pair = |j: usize| j + 1 < v.len() && v[j].0 == 2 && v[j + 1].0 == 3 && v[j].1 == v[j + 1].1;
        let mut j = i;
        while pair(j) {
            j += 2;
        }
        if j > i {
            let mut ids: Vec<u64> = (i..j).step_by(2).map(|k| v[k].1).collect();
            ids.sort_unstable();
            for (k, id) in (i..j).step_by(2).zip(ids) {
                v[k].1 = id;
                v[k + 1].1 = id;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    v
}

/// Whether a real run made the default run's requests: the same sequence, or, for a run that
/// ended in an OOM, the same sequence up to its failed request.
fn same_requests(own: &[(u8, u64, u64, usize)], default: &[(u8, u64, u64, usize)]) -> bool {
    match own.iter().position(|e| e.0 == 1) {
        None => own == default,
        Some(oom) => {
            oom < default.len()
                && own[..oom] == default[..oom]
                && default[oom].0 == 0
                && (default[oom].2, default[oom].3) == (own[oom].2, own[oom].3)
        }
    }
}

fn rel(a: u64, b: u64) -> f64 {
    (a as f64 - b as f64).abs() / b as f64
}

fn describe(r: &ReplayResult) -> String {
    match r.outcome {
        Outcome::Ok => "the replay completes".into(),
        Outcome::Oom { event, .. } => format!("the replay runs out of memory at event {event}"),
    }
}

/// The replay a user gets: the recorded default run under every row's setting and limit.
#[test]
fn default_run_replayed_under_every_row() {
    let rows = truth();
    let mut sequences: HashMap<String, Vec<(u8, u64, u64, usize)>> = HashMap::new();
    let (mut agree_first, mut agree_either, mut total) = (0, 0, 0);
    let (mut plain_rows, mut plain_agree) = (0, 0);
    let mut differing_runs = 0;
    let mut misses = Vec::new();
    // Misses the engine cannot blame on anything but itself.
    let mut unexplained: Vec<String> = Vec::new();
    let mut peak_errors = Vec::new();
    // Rows under a limit where the replay and PyTorch both completed: relative error of peak
    // reserved against the nearer of the two real runs.
    let mut limited_ok: Vec<f64> = Vec::new();
    // Rows where the replay ran out of memory at a request the recorded run served, an error
    // the program may have caught (`MayBeCaught`): the replay answers "cannot tell".
    let (mut cannot_tell, mut cannot_tell_caught) = (0, 0);
    for (first, second) in &rows {
        let r = replay(&default_trace(&first.workload), &first.policy, first.limit);
        total += 1;
        let runs_differ = first.oom != second.oom || first.peak_reserved != second.peak_reserved;
        differing_runs += runs_differ as u32;
        let caught = first.caught_an_oom() || second.caught_an_oom();
        if let Some(why) = r.failure_may_be_caught {
            cannot_tell += 1;
            cannot_tell_caught += caught as u32;
            println!(
                "cannot tell: {}: PyTorch {} (caught OOMs: {}); the replay runs out of memory at event {} ({why:?})",
                first.name(),
                if first.oom { "oom" } else { "ok" },
                if caught { "yes" } else { "no" },
                r.oom_event().unwrap_or(0),
            );
            continue;
        }
        let agrees = r.is_oom() == first.oom || r.is_oom() == second.oom;
        agree_first += (r.is_oom() == first.oom) as u32;
        agree_either += agrees as u32;
        // oom_catch's snapshot was recorded under its own limit: it holds requests the program
        // made only after a caught OOM.
        let plain = !caught && first.workload != "oom_catch";
        if plain {
            plain_rows += 1;
            plain_agree += agrees as u32;
        }
        if !agrees {
            let cause = if caught {
                "PyTorch raised an OOM that the program caught and went on with other requests".to_string()
            } else if first.workload == "oom_catch" {
                "the recorded run's requests after its caught OOM differ from this run's".to_string()
            } else {
                let own = requests(&own_trace(second));
                let default = sequences
                    .entry(first.workload.clone())
                    .or_insert_with(|| requests(&default_trace(&first.workload)));
                if same_requests(&own, default) {
                    // The same requests: replayed with the real run's own segment addresses
                    // (its snapshot), the engine must give PyTorch's outcome, or the miss is
                    // the engine's.
                    let with_own_addresses = replay(&own_trace(second), &first.policy, first.limit);
                    if with_own_addresses.is_oom() != second.oom {
                        unexplained.push(first.name());
                    }
                    format!(
                        "the same requests as the default run; with the real run's segment addresses {}: segment \
addresses",
                        describe(&with_own_addresses)
                    )
                } else {
                    "this run's own requests differ from the default run's".into()
                }
            };
            misses.push(format!(
                "{}: PyTorch {} (retries {}, caught or final OOMs {}); {}; cause: {cause}",
                first.name(),
                if first.oom { "oom" } else { "ok" },
                first.retries,
                first.ooms,
                describe(&r)
            ));
        }
        if first.limit.is_some() && !r.is_oom() && !first.oom {
            let err =
                rel(r.peak_reserved_bytes, first.peak_reserved).min(rel(r.peak_reserved_bytes, second.peak_reserved));
            if err > 0.005 {
                println!(
                    "under a limit, both complete: {}: peak reserved {} vs PyTorch {} / {}",
                    first.name(),
                    r.peak_reserved_bytes,
                    first.peak_reserved,
                    second.peak_reserved
                );
            }
            limited_ok.push(err);
        }
        if first.limit.is_none() && first.workload != "oom_catch" {
            let err =
                rel(r.peak_reserved_bytes, first.peak_reserved).min(rel(r.peak_reserved_bytes, second.peak_reserved));
            peak_errors.push((first.name(), err, r.peak_reserved_bytes, first.peak_reserved, second.peak_reserved));
        }
    }
    let told = total - cannot_tell;
    println!(
        "the replay answers on {told}/{total} rows; on {cannot_tell} it cannot tell (it fails at a request the program \
may have caught; PyTorch caught an OOM on {cannot_tell_caught} of them)"
    );
    println!("outcome agreement with the first pass: {agree_first}/{told} rows answered");
    println!("outcome agreement with a real run of the row (the two passes differ on {differing_runs} rows): {agree_either}/{told} rows answered");
    println!("  rows where PyTorch caught no OOM (workloads recorded without a limit): {plain_agree}/{plain_rows}");
    for m in &misses {
        println!("miss: {m}");
    }
    let mut within = 0;
    for (name, err, replayed, a, b) in &peak_errors {
        within += (*err <= 0.005) as u32;
        println!("unlimited {name}: peak reserved {replayed} vs PyTorch {a} / {b} ({:.3}%)", err * 100.0);
    }
    println!("unlimited rows within 0.5% of a real run's peak reserved: {within}/{}", peak_errors.len());
    let exact_limited = limited_ok.iter().filter(|&&e| e == 0.0).count();
    let within_limited = limited_ok.iter().filter(|&&e| e <= 0.005).count();
    let worst = limited_ok.iter().cloned().fold(0.0, f64::max);
    println!(
        "rows under a limit that both completed: {}; peak reserved exact in {exact_limited}, within 0.5% in {within_limited}, worst {:.2}%",
        limited_ok.len(),
        worst * 100.0
    );

    // What holds: the replay says "cannot tell" only where a real run of the row caught an
    // OOM (and so went on with requests the default run never made)...
    assert_eq!(cannot_tell_caught, cannot_tell);
    // ...where it answers and misses, the real run made other requests, or made the same ones
    // and the engine gives PyTorch's outcome once it has that run's segment addresses (the
    // driver's placement decides the lowest-address tie-breaks of best fit)...
    assert!(unexplained.is_empty(), "misses with the real run's own addresses too: {unexplained:?}");
    // The share it agrees on: the target, 99% (223 of 225 with segments that no recorded
    // address places put where the driver's rule puts them; 222 first fit upward).
    assert!(agree_either as f64 >= 0.99 * told as f64, "{agree_either}/{told}");
    // ...and its unlimited peak reserved is within 0.5% wherever the real run's own requests
    // were the default run's, or is PyTorch's, byte for byte, with that run's addresses.
    for (name, err, ..) in &peak_errors {
        let row = rows.iter().find(|(a, _)| &a.name() == name).unwrap();
        let own = requests(&own_trace(&row.1));
        let same = same_requests(&own, &requests(&default_trace(&row.0.workload)));
        if !same {
            println!("{name}: the real run's requests differ from the default run's (not asserted)");
        } else if *err > 0.005 {
            let with_own = replay(&own_trace(&row.1), &row.1.policy, None);
            println!(
                "{name}: the same requests; with the real run's segment addresses peak reserved {} vs PyTorch {}",
                with_own.peak_reserved_bytes, row.1.peak_reserved
            );
            assert_eq!(with_own.peak_reserved_bytes, row.1.peak_reserved, "{name}: {:.3}%", err * 100.0);
        }
    }
}

/// The engine alone: every real run's own requests under its own setting and limit. Until a
/// caught OOM (the replay stops at the first OOM, as a program that does not catch it would),
/// PyTorch's outcome and peaks, byte for byte.
#[test]
fn every_real_run_replayed_under_its_own_setting() {
    let (mut rows, mut exact, mut outcome) = (0, 0, 0);
    let mut off = Vec::new();
    for (_, row) in truth() {
        if row.caught_an_oom() {
            continue;
        }
        let r = replay(&own_trace(&row), &row.policy, row.limit);
        rows += 1;
        outcome += (r.is_oom() == row.oom) as u32;
        if r.is_oom() == row.oom
            && r.peak_reserved_bytes == row.peak_reserved
            && r.peak_allocated_bytes == row.peak_allocated
        {
            exact += 1;
        } else {
            off.push(format!(
                "{}: reserved {} vs {}, allocated {} vs {}, {} (PyTorch {})",
                row.name(),
                r.peak_reserved_bytes,
                row.peak_reserved,
                r.peak_allocated_bytes,
                row.peak_allocated,
                describe(&r),
                if row.oom { "oom" } else { "ok" }
            ));
        }
    }
    println!("own runs without a caught OOM: outcome {outcome}/{rows}, outcome and both peaks exact {exact}/{rows}");
    for o in &off {
        println!("not exact: {o}");
    }
    assert_eq!(outcome, rows);
    assert_eq!(exact, rows);
}

/// `garbage_collection_threshold` acts only when a memory fraction is set
/// (`garbage_collect_cached_blocks` is called only when `set_fraction`): with no limit PyTorch's
/// gc06 runs are the default runs, counter for counter (on workloads whose two passes agree on
/// every row: where `record_stream` frees complete follows the GPU's progress, two runs of one
/// setting already differ); under a limit it changes the run.
#[test]
fn gc_threshold_acts_only_with_a_memory_fraction() {
    let rows = truth();
    let find = |w: &str, p: &str, l: &str| rows.iter().find(|(a, _)| a.workload == w && a.policy == p && a.level == l);
    let timing_dependent: std::collections::HashSet<&str> = rows
        .iter()
        .filter(|(a, b)| (a.oom, a.peak_reserved, a.peak_allocated) != (b.oom, b.peak_reserved, b.peak_allocated))
        .map(|(a, _)| a.workload.as_str())
        .collect();
    println!("workloads whose two passes differ: {timing_dependent:?}");
    let mut changed_under_a_limit = 0;
    for (gc, _) in rows.iter().filter(|(a, _)| a.policy == "gc06") {
        let (default, _) = find(&gc.workload, "default", &gc.level).unwrap();
        if gc.limit.is_none() && !timing_dependent.contains(gc.workload.as_str()) {
            assert_eq!(
                (gc.peak_reserved, gc.peak_allocated, gc.retries, gc.ooms),
                (default.peak_reserved, default.peak_allocated, default.retries, default.ooms),
                "{}",
                gc.name()
            );
            let a = replay(&default_trace(&gc.workload), "gc06", None);
            let b = replay(&default_trace(&gc.workload), "default", None);
            assert_eq!((a.peak_reserved_bytes, a.num_device_free), (b.peak_reserved_bytes, b.num_device_free));
        } else if gc.limit.is_some() {
            changed_under_a_limit += (gc.peak_reserved != default.peak_reserved) as u32;
        }
    }
    assert!(changed_under_a_limit > 10, "{changed_under_a_limit}");
}

/// Addresses decide an outcome: varlen_train under max_split_size_mb:64 at 1.10x its peak made
/// the same requests as the default run (and frees, in the same order), and PyTorch ran out of
/// memory. Equal-size free blocks are taken lowest address first, so the outcome turns on where
/// the driver put the segments. The setting sizes some segments otherwise than the default run
/// did, so no recorded address places them: placed by the driver's rule
/// (`recorder/src/device/placement.rs`), the replay of the default run runs out of memory, as
/// does the replay at the addresses of PyTorch's own max_split_size_mb:64 run. (Placed first fit
/// upward from a fixed base, as before that rule, it completed.)
#[test]
fn addresses_decide_varlen_train_under_max_split_size() {
    let rows = truth();
    let (row, _) = rows.iter().find(|(a, _)| a.name() == "varlen_train maxsplit64 1.10").unwrap();
    assert!(row.oom);
    let own_unlimited = dir().join("own/varlen_train.maxsplit64.unlimited.atrace");
    assert_eq!(requests(&own_unlimited), requests(&default_trace("varlen_train")));
    assert!(replay(&default_trace("varlen_train"), "maxsplit64", row.limit).is_oom());
    assert!(replay(&own_unlimited, "maxsplit64", row.limit).is_oom());
}

/// What a replay that goes on past failed requests, as a program that catches OOMs does, ends
/// with: PyTorch's counters at the end of the run.
#[derive(Debug, PartialEq)]
struct Continued {
    peak_reserved: u64,
    peak_allocated: u64,
    num_ooms: u64,
    /// Requests that failed in the replay but not in the recorded run.
    unrecorded_failures: u64,
}

/// Replays every request of a real run under its own setting and limit with the analyzer's
/// replay, which goes on after an OOM the program caught (the failed request gets nothing, the
/// program goes on with the requests it made next) and stops at a request that fails where the
/// recorded run did not.
fn replay_continuing(path: &Path, policy: &str, limit: Option<u64>) -> Continued {
    let trace = analyzer::model::Trace::open(path).unwrap();
    let opts = ReplayOptions {
        config: Some(conf(policy)),
        capacity_bytes: limit,
        unlimited: limit.is_none(),
        ..Default::default()
    };
    let r = analyzer::replay::replay(&trace, &opts).unwrap();
    let recorded = |e: u64| trace.facts.recorded_ooms.iter().any(|o| o.event == e);
    Continued {
        peak_reserved: r.peak_reserved_bytes,
        peak_allocated: r.peak_allocated_bytes,
        num_ooms: r.num_ooms,
        unrecorded_failures: r.oom_event().is_some_and(|e| !recorded(e)) as u64,
    }
}

/// Real runs that caught OOMs (cuDNN retrying with a smaller workspace; `oom_catch` halving its
/// batch), replayed under their own setting and limit past every caught OOM: the engine fails
/// exactly the requests PyTorch failed, and ends with PyTorch's peaks.
#[test]
fn real_runs_that_caught_ooms_replayed_past_them() {
    let (mut rows, mut same_failures, mut exact) = (0, 0, 0);
    let mut off = Vec::new();
    for (_, row) in truth() {
        if !row.caught_an_oom() {
            continue;
        }
        rows += 1;
        let c = replay_continuing(&own_trace(&row), &row.policy, row.limit);
        let failures_match = c.unrecorded_failures == 0 && c.num_ooms == row.ooms;
        same_failures += failures_match as u32;
        if failures_match && c.peak_reserved == row.peak_reserved && c.peak_allocated == row.peak_allocated {
            exact += 1;
        } else {
            off.push(format!(
                "{}: ooms {} vs {} (+{} unrecorded), reserved {} vs {}, allocated {} vs {}",
                row.name(),
                c.num_ooms,
                row.ooms,
                c.unrecorded_failures,
                c.peak_reserved,
                row.peak_reserved,
                c.peak_allocated,
                row.peak_allocated
            ));
        }
    }
    println!("runs with caught OOMs: the same failed requests in {same_failures}/{rows}, and both peaks exact in {exact}/{rows}");
    for o in &off {
        println!("not exact: {o}");
    }
    assert_eq!(same_failures, rows);
    assert_eq!(exact, rows);
}

/// The truth policy a `PYTORCH_CUDA_ALLOC_CONF` value names, if the truth table has it.
fn truth_policy(conf: &str) -> Option<&'static str> {
    match conf {
        "" => Some("default"),
        "expandable_segments:True" => Some("expandable"),
        "max_split_size_mb:64" => Some("maxsplit64"),
        "roundup_power2_divisions:4" => Some("pow2div4"),
        "garbage_collection_threshold:0.6" => Some("gc06"),
        _ => None,
    }
}

/// `WORKLOAD.default.LEVEL.atrace` (an OOM case): the workload and the level.
fn level_of(path: &Path) -> Option<(String, String)> {
    let name = path.file_name()?.to_str()?.strip_suffix(".atrace")?;
    let (workload, level) = name.split_once(".default.")?;
    (level != "unlimited").then(|| (workload.to_string(), level.to_string()))
}

/// The OOM cases: each workload's default run at a limit where it ran out of memory, as a user
/// would bring it (the snapshot, the limit known). `explain` there, against what real PyTorch
/// did under each setting at that limit:
/// - advice accuracy: every advised setting completed in real PyTorch at that limit;
/// - recall: where some setting completed in PyTorch at that limit, `explain` names one of them,
///   advised or worth trying (a snapshot stops at the failure: what gets past it is worth trying);
/// - nothing is called "completes" (the trace is a prefix: a replay fails there, sooner, or gets
///   past the failed request);
/// - verdict accuracy: where the whole job is predicted (a repeated iteration), the prediction
///   for each setting of the truth table against PyTorch's outcome.
#[test]
fn advice_at_oom_cases_holds_in_real_pytorch() {
    use analyzer::analysis::explain::{explain_with, ExplainOptions};
    use analyzer::analysis::outcome::{JobPrediction, Reach};
    use analyzer::model::Trace;
    let rows = truth();
    let real = |workload: &str, level: &str, policy: &str| -> Option<(bool, bool)> {
        rows.iter()
            .find(|(a, _)| a.workload == workload && a.level == level && a.policy == policy)
            .map(|(a, b)| (!a.oom, !b.oom))
    };
    let mut cases: Vec<PathBuf> =
        std::fs::read_dir(dir()).unwrap().map(|e| e.unwrap().path()).filter(|p| level_of(p).is_some()).collect();
    cases.sort();
    assert_eq!(cases.len(), 14, "the OOM cases of the table in docs/fidelity.md");
    let (mut advised, mut held, mut held_both, mut unverifiable) = (0, 0, 0, 0);
    let (mut predicted, mut predicted_right, mut cannot_tell) = (0, 0, 0);
    let (mut fixable, mut found, mut worth_named, mut worth_completed) = (0u32, 0u32, 0u32, 0u32);
    let mut wrong = Vec::new();
    for path in &cases {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let (workload, level) = level_of(path).unwrap();
        let workload = workload.as_str();
        let trace = Trace::open(path).unwrap();
        let r = explain_with(&trace, &ExplainOptions::default()).unwrap();
        assert_eq!(r.moment, "oom", "{name}");
        for w in &r.whatif {
            assert_ne!(w.reach, Reach::Completes, "{name}: {} is called complete on a prefix", w.policy);
        }
        for a in r.advice.iter().filter(|a| a.kind == "setting") {
            let conf = a.setting.as_deref().unwrap().trim_start_matches("PYTORCH_CUDA_ALLOC_CONF=");
            advised += 1;
            match truth_policy(conf).and_then(|p| real(workload, &level, p)) {
                Some((first, second)) => {
                    held += first as u32;
                    held_both += (first && second) as u32;
                    if !first {
                        wrong.push(format!("{name}: advised {conf}, which ran out of memory in PyTorch"));
                    }
                }
                None => {
                    unverifiable += 1;
                    println!("{name}: advised {conf}, not in the truth table");
                }
            }
        }
        // Recall: where some setting completed in PyTorch at this limit, explain names one of
        // them (advised or worth trying).
        let completed: Vec<&str> = ["expandable", "maxsplit64", "pow2div4", "gc06"]
            .into_iter()
            .filter(|p| real(workload, &level, p).is_some_and(|t| t.0))
            .collect();
        let named: Vec<&'static str> = r
            .advice
            .iter()
            .filter_map(|a| a.setting.as_deref())
            .chain(r.worth_trying.iter().map(|w| w.setting.as_str()))
            .filter_map(|s| truth_policy(s.trim_start_matches("PYTORCH_CUDA_ALLOC_CONF=")))
            .collect();
        for w in &r.worth_trying {
            if let Some(t) = truth_policy(w.setting.trim_start_matches("PYTORCH_CUDA_ALLOC_CONF=")) {
                worth_named += 1;
                worth_completed += real(workload, &level, t).is_some_and(|t| t.0) as u32;
            }
        }
        if !completed.is_empty() {
            fixable += 1;
            if named.iter().any(|n| completed.contains(n)) {
                found += 1;
            } else {
                println!("{name}: {completed:?} completed in PyTorch; explain named {named:?}");
            }
        }
        match &r.prediction {
            Some(JobPrediction::FromRepeatedIteration { policies, .. }) => {
                for p in policies {
                    let Some(truth) =
                        truth_policy(&p.policy.name().replace("recorded", "")).and_then(|t| real(workload, &level, t))
                    else {
                        continue;
                    };
                    predicted += 1;
                    if p.fits == truth.0 {
                        predicted_right += 1;
                    } else {
                        println!(
                            "{name}: {} predicted to {}, PyTorch {}",
                            p.policy,
                            if p.fits { "fit" } else { "run out of memory" },
                            if truth.0 { "completed" } else { "ran out of memory" }
                        );
                    }
                    // Nothing called "fits" that PyTorch did not complete.
                    if p.fits && !truth.0 {
                        wrong.push(format!("{name}: {} predicted to fit, PyTorch ran out of memory", p.policy));
                    }
                }
            }
            Some(JobPrediction::CannotTell { reason }) => {
                cannot_tell += 1;
                println!("{name}: the trace cannot tell: {reason}");
            }
            None => panic!("{name}: an OOM trace without a prediction"),
        }
    }
    let checked = advised - unverifiable;
    println!(
        "advice accuracy: {held}/{checked} advised settings completed in real PyTorch at the user's limit \
({held_both}/{checked} in both passes; {unverifiable} advised settings are not in the truth table)"
    );
    println!(
        "verdict accuracy: {predicted_right}/{predicted} predictions of the whole job (setting x OOM case) agree with \
PyTorch; {cannot_tell}/{} OOM cases where the trace cannot tell",
        cases.len()
    );
    println!(
        "recall: {found}/{fixable} OOM cases where a setting completed in PyTorch have one named (advised or worth \
trying); {worth_completed}/{worth_named} settings named worth trying completed"
    );
    for w in &wrong {
        println!("wrong: {w}");
    }
    assert!(wrong.is_empty(), "{} answers real PyTorch contradicts", wrong.len());
}

/// The two patterns `explain` diagnoses with figures, on the truth workloads that have them:
/// `empty_cache_loop` (`gc.collect(); torch.cuda.empty_cache()` after every batch) replayed
/// without its calls, and `two_streams` (`record_stream`) with the bytes held, by the stream
/// that allocated them.
#[test]
fn empty_cache_in_the_loop_and_record_stream_are_diagnosed() {
    use analyzer::analysis::explain::explain;
    use analyzer::model::Trace;
    let r = explain(&Trace::open(&default_trace("empty_cache_loop")).unwrap()).unwrap();
    let e = r.empty_cache_calls.as_ref().expect("empty_cache() in the loop is diagnosed");
    println!("empty_cache_loop: {}", e.text());
    assert!(e.calls >= 10, "{}", e.calls);
    assert!(e.device_calls_without < e.device_calls_with);
    assert!(r.advice.iter().any(|a| a.text.contains("empty_cache") && a.evidence.contains("device calls")));
    assert!(r.held_for_streams.is_none(), "one stream: nothing waits for another");
    let trace = Trace::open(&default_trace("two_streams")).unwrap();
    let r = explain(&trace).unwrap();
    let h = r.held_for_streams.as_ref().expect("blocks held for another stream are diagnosed");
    println!("two_streams: {}", h.text());
    assert!(h.peak_held_bytes > h.live_at_peak_bytes, "held back more than is live");
    // Only the side stream's tensors are marked with record_stream: every held block was
    // allocated there, none on the main stream, which allocated the weights first.
    let mut main = None;
    trace
        .scan(|_, r| {
            if let Event::Alloc { stream, .. } = r.event {
                main.get_or_insert(stream);
            }
        })
        .unwrap();
    assert_eq!(h.by_stream_at_peak.len(), 1, "{:?}", h.by_stream_at_peak);
    assert_ne!(Some(h.by_stream_at_peak[0].0), main);
    assert!(h.raised_the_peak());
    assert!(r.empty_cache_calls.is_none());
}

/// No leak verdict on a loop without a leak: every truth workload (none leaks; `val_no_grad`
/// keeps two autograd graphs alive at once, `amp_adamw` makes AdamW's state on its first step,
/// `varlen_train` and `empty_cache_loop` vary their batch) and every shipped trace but
/// `leak_list_append`, which leaks.
#[test]
fn no_leak_verdict_on_loops_without_a_leak() {
    use analyzer::analysis::leaks::{analyze, LeaksOptions};
    use analyzer::model::Trace;
    let mut paths: Vec<PathBuf> =
        ["amp_adamw", "varlen_train", "two_streams", "empty_cache_loop", "val_no_grad", "oom_catch"]
            .iter()
            .map(|w| default_trace(w))
            .collect();
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    for e in std::fs::read_dir(&traces).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "atrace") {
            paths.push(p);
        }
    }
    paths.sort();
    for p in &paths {
        let r = analyze(&Trace::open(p).unwrap(), &LeaksOptions::default()).unwrap();
        let leaking = r.growth.as_ref().is_some_and(|g| !g.sites.is_empty());
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        println!("{name}: {}", if leaking { "leak" } else { "no leak" });
        assert_eq!(leaking, name.starts_with("leak_list_append"), "{name}");
    }
    let amp = analyze(&Trace::open(&default_trace("amp_adamw")).unwrap(), &LeaksOptions::default()).unwrap();
    assert!(amp.growth.unwrap().one_time_bytes > 0, "AdamW's first step is named one-time state");
}

/// The capacity search resumes its probes from saves of the unlimited run, which must go on
/// past the OOMs the program caught as every replay does: on `amp_adamw` at 1.0x (164 caught
/// cuDNN workspace OOMs) it served each caught request and kept it, and found that the run
/// needed 25.38 GiB to get past a failure a 1.20 GiB replay gets past. Each policy's smallest
/// capacity is now one at which its replay gets past the failure, and no more than its
/// unlimited replay's peak reserved.
#[test]
fn the_capacity_search_goes_on_past_caught_ooms() {
    use analyzer::analysis::whatif::{whatif, WhatifOptions};
    use analyzer::model::Trace;
    let trace = Trace::open(&dir().join("amp_adamw.default.1.00.atrace")).unwrap();
    assert!(trace.facts.caught_ooms() > 100);
    let w = whatif(
        &trace,
        &WhatifOptions { capacity: trace.default_capacity(), search_capacity: true, repeats: 3, rows_only: false },
    )
    .unwrap();
    for row in &w.rows {
        let min = row.min_capacity_bytes.expect("searched");
        let config = AllocatorConfig::parse(&row.alloc_conf).unwrap();
        let at = |capacity: Option<u64>| {
            let opts = ReplayOptions {
                config: Some(config.clone()),
                capacity_bytes: capacity,
                unlimited: capacity.is_none(),
                ..Default::default()
            };
            analyzer::replay::replay(&trace, &opts).unwrap()
        };
        assert!(at(Some(min)).reach.gets_past(), "{}: {min}", row.policy);
        let unlimited = at(None);
        assert!(min <= unlimited.peak_reserved_bytes, "{}: {min} > {}", row.policy, unlimited.peak_reserved_bytes);
    }
}

/// The whole job's need where the program catches failed cuDNN workspaces: `amp_adamw`'s snapshot
/// at 1.00x holds 163 out-of-memory errors the program caught before the fatal one (cuDNN trying a
/// plan with a smaller workspace). The repeated iterations go on past a scratch buffer that fails,
/// as PyTorch's cuDNN does; the need under `max_split_size_mb:64` then lies where both passes of
/// PyTorch put it, above the limit at which that setting ran out of memory and at most the one
/// at which it completed (it was predicted 1.16 GiB, over the 1.04 GiB it completed at), and the
/// defaults' need comes within 2% of the limit they completed at (it was 11% over).
#[test]
fn a_whole_job_that_catches_failed_workspaces_needs_what_pytorch_needed() {
    use analyzer::analysis::explain::{explain_with, ExplainOptions};
    use analyzer::analysis::outcome::JobPrediction;
    use analyzer::source::input::{open, RunFacts};
    let rows = read_truth("truth.tsv");
    let limit = rows.iter().find(|r| r.workload == "amp_adamw" && r.level == "1.00").unwrap().limit.unwrap();
    let t = open(
        &dir().join("amp_adamw.default.1.00.pickle"),
        &RunFacts { capacity_bytes: Some(limit), ..Default::default() },
    )
    .unwrap();
    let r = explain_with(&t, &ExplainOptions::default()).unwrap();
    let Some(JobPrediction::FromRepeatedIteration { caught_ooms, policies, .. }) = &r.prediction else {
        panic!("a prediction: {:?}", r.prediction)
    };
    assert!(*caught_ooms > 100, "{caught_ooms}");
    // The interval real runs bound: the largest limit at which PyTorch failed, the least at which it
    // completed, under one setting.
    let interval = |policy: &str| {
        let runs = rows.iter().filter(|r| r.workload == "amp_adamw" && r.policy == policy && r.limit.is_some());
        let fail = runs.clone().filter(|r| r.oom).filter_map(|r| r.limit).max().unwrap();
        let done = runs.filter(|r| !r.oom).filter_map(|r| r.limit).min().unwrap();
        (fail, done)
    };
    let need = |name: &str| policies.iter().find(|p| p.policy.name() == name).and_then(|p| p.needs_bytes).unwrap();
    let (fail, done) = interval("maxsplit64");
    let n = need("max_split_size_mb:64");
    assert!(fail < n && n <= done, "max_split_size_mb:64 needs {n}; PyTorch failed at {fail}, completed at {done}");
    let (_, done) = interval("default");
    let n = need("recorded");
    assert!(n as f64 <= done as f64 * 1.02, "the defaults need {n}; PyTorch completed at {done}");
}
