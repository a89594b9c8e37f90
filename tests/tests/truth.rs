//! Ground truth from real PyTorch 2.11 runs on an H100 (`tests/fixtures/truth/`, made by
//! `scripts/gpu/truth_run.py`): each workload's recorded default run, replayed under the setting
//! and limit of every truth row, against what PyTorch itself did in a fresh process under that
//! setting and limit.

use analyzer::replay::{replay_file, Outcome, ReplayOptions, ReplayResult};
use analyzer::tracefile;
use recorder::engine::config::AllocatorConfig;
use recorder::trace::Event;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/truth")
}

#[derive(Debug)]
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

fn truth() -> Vec<Row> {
    let text = std::fs::read_to_string(dir().join("truth.tsv")).unwrap();
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

fn replay(row: &Row) -> ReplayResult {
    let path = dir().join(format!("{}.default.atrace", row.workload));
    let opts = ReplayOptions {
        config: Some(conf(&row.policy)),
        capacity_bytes: row.limit,
        unlimited: row.limit.is_none(),
        output: None,
    };
    replay_file(&path, &opts).unwrap()
}

/// Indices of the recorded OOMs that the recorded program survived (more requests follow).
fn survived_ooms(workload: &str) -> Vec<u64> {
    let path = dir().join(format!("{workload}.default.atrace"));
    let (mut ooms, mut last_alloc) = (Vec::new(), 0);
    tracefile::scan(&path, |i, r| match r.event {
        Event::Oom { .. } => ooms.push(i),
        Event::Alloc { .. } => last_alloc = i,
        _ => {}
    })
    .unwrap();
    ooms.retain(|&i| i < last_alloc);
    ooms
}

fn rel(a: u64, b: u64) -> f64 {
    (a as f64 - b as f64).abs() / b as f64
}

#[derive(Default)]
struct Tally {
    rows: usize,
    agree: usize,
    misses: Vec<String>,
    /// Unlimited rows: (row, relative error of peak reserved).
    unlimited: Vec<(String, f64)>,
}

fn tally() -> Tally {
    let mut t = Tally::default();
    for row in truth() {
        let r = replay(&row);
        let name = format!("{} {} {}", row.workload, row.policy, row.level);
        t.rows += 1;
        if r.is_oom() == row.oom {
            t.agree += 1;
        } else {
            let at = match r.outcome {
                Outcome::Oom { event, .. } => {
                    let caught = survived_ooms(&row.workload).contains(&event);
                    format!(
                        "replay: OOM at event {event}{}",
                        if caught { " (a recorded OOM the program caught)" } else { "" }
                    )
                }
                Outcome::Ok => "replay: completes".into(),
            };
            t.misses.push(format!(
                "{name}: PyTorch {} (retries {}, ooms {}); {at}",
                if row.oom { "oom" } else { "ok" },
                row.retries,
                row.ooms
            ));
        }
        if row.limit.is_none() {
            t.unlimited.push((name.clone(), rel(r.peak_reserved_bytes, row.peak_reserved)));
            println!(
                "{name}: peak reserved {} vs {} ({:+.3}%), peak allocated {} vs {}",
                r.peak_reserved_bytes,
                row.peak_reserved,
                (r.peak_reserved_bytes as f64 / row.peak_reserved as f64 - 1.0) * 100.0,
                r.peak_allocated_bytes,
                row.peak_allocated
            );
        }
    }
    t
}

#[test]
fn truth_table_outcomes_and_peaks() {
    let t = tally();
    println!("outcome agreement: {}/{} rows", t.agree, t.rows);
    for m in &t.misses {
        println!("miss: {m}");
    }
    let exact = t.unlimited.iter().filter(|(_, e)| *e == 0.0).count();
    let within = t.unlimited.iter().filter(|(_, e)| *e <= 0.005).count();
    println!("unlimited rows: {exact}/{} exact peak reserved, {within} within 0.5%", t.unlimited.len());
}
