//! The passes one `report` makes over a trace's records, named: the report's design is one read,
//! folds, and replays driven by the one replay loop. A change that adds a pass changes this list
//! on purpose.

use analyzer::model::{Pass, PassKind, Trace};
use analyzer::render::report::{build, ReportOptions};
use std::collections::BTreeMap;
use std::path::Path;

fn report_passes(trace: &str) -> (BTreeMap<(PassKind, &'static str), usize>, usize) {
    report_passes_searching(trace, true)
}

fn report_passes_searching(trace: &str, search: bool) -> (BTreeMap<(PassKind, &'static str), usize>, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let t = Trace::open(&root.join("traces").join(trace)).unwrap();
    build(&t, &ReportOptions { search_capacity: search, search_long_traces: false }).unwrap();
    let passes: Vec<Pass> = t.passes();
    let mut named = BTreeMap::new();
    for p in &passes {
        *named.entry((p.kind, p.by)).or_insert(0) += 1;
    }
    println!("{trace}: {} passes after the read", passes.len());
    for ((kind, by), n) in &named {
        println!("  {kind:?} {by}: {n}");
    }
    (named, passes.len())
}

/// `report` on GPT-2's training trace: one read, then these passes. The capacity search's
/// replays are probes resumed from checkpoints of the unlimited run (each replays the records
/// after its checkpoint, not the whole trace), and none is made at a capacity that an earlier
/// probe's band holds (66 probes before bands, 37 with them); 6 of them are the searches' first probes, each at
/// its setting's floor (`Bounds::held_floor_bytes`), which fail at the first request that
/// needs more, early after the checkpoint they resume from; the what-if table's replays drive its settings,
/// and its replay under the recorded settings carries the watches of every analysis of the
/// report (leaks, explain, frag, the pictures). The report's own replay stops at the moment
/// whose layout those found that they need. A fold that the summary's event counts rule out
/// is not made, nor one that the trace's facts rule out (no `empty_cache()` call to count here,
/// no free that waited for another stream; a snapshot's requests carry no block
/// sizes to fold a timeline from). `max_split_size_mb:512` is the same run as the
/// recorded settings on this trace (its largest segment is below 512 MiB): replayed once, with no
/// capacity search of its own.
#[test]
fn report_makes_the_passes_it_names() {
    use PassKind::{Fold, Replay};
    let (named, total) = report_passes("gpt2_train.default.atrace");
    let held: BTreeMap<(PassKind, &str), usize> = [
        ((Fold, "category"), 2),
        ((Fold, "leaks"), 2),
        ((Fold, "picture"), 1),
        ((Fold, "report"), 1),
        ((Fold, "whatif"), 1),
        ((Replay, "capacity_search"), 37),
        ((Replay, "report"), 1),
        ((Replay, "whatif"), 6),
    ]
    .into_iter()
    .collect();
    assert_eq!(named, held);
    assert_eq!(total, 51);
    // On other shipped traces: the same analyses, and at most as many passes outside the
    // capacity search (one what-if replay pass per setting with an OOM to probe).
    for trace in ["frag_oom.default.atrace", "recorded_gpt2_train.atrace", "seed_experiments.default.atrace"] {
        let (named, _) = report_passes(trace);
        for (kind, by) in named.keys() {
            assert!(held.keys().any(|(_, h)| h == by) || *by == "explain", "{trace}: {kind:?} pass by {by}");
        }
        let folds: usize = named.iter().filter(|((k, _), _)| *k == Fold).map(|(_, n)| n).sum();
        let replays: usize =
            named.iter().filter(|((k, by), _)| *k == Replay && *by != "capacity_search").map(|(_, n)| n).sum();
        assert!(folds <= 12, "{trace}: {folds} folds");
        // A run that ends out of memory takes the segment map as it passes the failure: no
        // second replay of the report's own.
        if trace == "frag_oom.default.atrace" {
            assert!(!named.contains_key(&(Replay, "report")), "{trace}: {named:?}");
        }
        assert!(replays <= 24, "{trace}: {replays} replay passes besides the capacity search");
    }
}

/// `frag` (as its command runs it, at the moment that matters): one replay, and the bounds'
/// fold beside it (the offline plan it compares with). The streams it names are the trace's
/// own numbering, taken as the trace is read, with no pass of their own.
#[test]
fn frag_makes_one_replay_and_the_bounds_fold() {
    use PassKind::{Fold, Replay};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let t = Trace::open(&root.join("traces/frag_oom.default.atrace")).unwrap();
    analyzer::analysis::frag::analyze_where_it_matters(&t, None).unwrap();
    let mut named = BTreeMap::new();
    for p in t.passes() {
        *named.entry((p.kind, p.by)).or_insert(0) += 1;
    }
    let held: BTreeMap<(PassKind, &str), usize> = [((Fold, "whatif"), 1), ((Replay, "frag"), 1)].into_iter().collect();
    assert_eq!(named, held);
}

/// `report` without a capacity search (a long trace, or `--no-search`) on a trace recorded by
/// alloctrace: one pass carries the report's folds of the records (memory over time from the
/// recorded counters, the call sites' peaks for live bytes by call site, and `leaks`' folds),
/// and the bounds' fold rides the what-if table's replays: no pass of its own. Besides: the
/// growth's pass (live bytes by site at each iteration the first pass found), and the report's
/// replay to the peak, whose layout it shows.
#[test]
fn report_without_a_search_folds_in_one_pass_and_rides_the_replays() {
    use PassKind::{Fold, Replay};
    let (named, total) = report_passes_searching("recorded_gpt2_train.atrace", false);
    let held: BTreeMap<(PassKind, &str), usize> =
        [((Fold, "leaks"), 1), ((Fold, "report"), 1), ((Replay, "report"), 1), ((Replay, "whatif"), 1)]
            .into_iter()
            .collect();
    assert_eq!(named, held);
    assert_eq!(total, 4);
}

/// `explain` on GPT-2's training trace, whose iterations a repeated annotation marks: the growth
/// over those iterations is one fold, with no first fold to find a period in the requests.
#[test]
fn explain_folds_the_growth_once_where_marks_say_the_iterations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let t = Trace::open(&root.join("traces/gpt2_train.default.atrace")).unwrap();
    assert!(t.facts.iterations.iterations().is_some());
    analyzer::analysis::explain::explain(&t).unwrap();
    let leaks = t.passes().iter().filter(|p| p.kind == PassKind::Fold && p.by == "leaks").count();
    assert_eq!(leaks, 1, "{:?}", t.passes());
}
