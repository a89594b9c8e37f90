//! `alloctrace whatif TRACE [--capacity 24GiB] [--json]`: the policies side by side.

use super::{damage_exit, write_json};
use crate::analysis::whatif::{whatif, Whatif, WhatifOptions, DEVICE_CALL_US};
use crate::model::units::{fmt_bytes, fmt_need};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct WhatifCmdOptions {
    pub trace: PathBuf,
    /// What the user says about the run (limit, settings, device of a snapshot).
    pub facts: crate::source::input::RunFacts,
    /// `None`: the trace's own capacity, if it recorded one.
    pub capacity_bytes: Option<u64>,
    pub search_capacity: bool,
    /// Iterations appended to predict the rest of a job that ran out of memory.
    pub repeats: u32,
    pub json: bool,
}

pub fn print_table(out: &mut dyn Write, w: &Whatif) -> std::io::Result<()> {
    // The capacity as every command says it: with where it came from.
    let capacity = crate::model::Capacity::of(w.capacity_bytes, w.capacity_source);
    let at = match w.capacity_bytes {
        Some(_) => format!("at capacity {}", capacity.text()),
        None => format!("with {}", crate::model::units::fmt_limit(None)),
    };
    writeln!(out, "what-if for {} {at}", w.trace)?;
    if let Some(p) = &w.predicted {
        writeln!(out, "{}", crate::model::wrap::indented(p, "", "  "))?;
    }
    if w.lower_bound {
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(
                "lower bound: the prediction leaves out memory named above, so its peaks are lower bounds and a setting \
whose replay completes is not said to fit (cannot tell); run the step for real at the limit to know",
                "",
                "  "
            )
        )?;
    }
    if let Some(d) = &w.input_damage {
        writeln!(out, "partial input: {d}; the rows cover only what was read")?;
    }
    writeln!(
        out,
        "{:<32} {:>12} {:>12} {:>11} {:>7} {:>9} {:>11}",
        "policy", "outcome", "decision", "peak rsvd", "frag.", "dev.calls", "min capac."
    )?;
    for r in &w.rows {
        writeln!(
            out,
            "{:<32} {:>12} {:>12} {:>11} {:>6.1}% {:>9} {:>11}",
            r.policy,
            r.reach,
            r.decision.short(),
            fmt_bytes(r.peak_reserved_bytes),
            r.fragmentation * 100.0,
            r.num_device_alloc + r.num_device_free,
            r.min_capacity_bytes.map(fmt_need).unwrap_or_else(|| "-".into())
        )?;
    }
    let b = &w.bounds;
    let none = w.no_caching();
    writeln!(
        out,
        "{:<32} {:>12} {:>12} {:>11} {:>7} {:>9} {:>11}",
        "no caching (see the last line)",
        none.outcome(),
        "-",
        none.peak_reserved_bytes.map(fmt_bytes).unwrap_or_else(|| "-".into()),
        none.peak_reserved_bytes.map(|_| "0.0%").unwrap_or("-"),
        b.no_caching_device_calls,
        fmt_need(none.min_capacity_bytes)
    )?;

    let failed = if b.includes_failed_request { "  (with the request that failed)" } else { "" };
    writeln!(out, "what the requests themselves need:")?;
    writeln!(
        out,
        "  peak of live requested bytes      {}  no allocator needs less{failed}",
        fmt_bytes(b.live_requested_peak_bytes)
    )?;
    match (b.offline_plan_bytes, &b.offline_plan_note) {
        (Some(p), _) => writeln!(
            out,
            "  offline plan (greedy by size)     {}  knows every lifetime in advance; a heuristic, not a bound{failed}",
            fmt_bytes(p)
        )?,
        (None, Some(n)) => writeln!(out, "  offline plan (greedy by size)     {n}")?,
        (None, None) => {}
    }
    // Notes are prose: wrapped to the screen, continued two spaces in.
    let note = |out: &mut dyn Write, text: &str| writeln!(out, "{}", crate::model::wrap::indented(text, "", "  "));
    if w.prediction.is_some() {
        note(
            out,
            "the trace ends in an out-of-memory error: each replay fails there, fails sooner, or gets past the request \
that failed (the rest of the job is not in the trace); min capacity = smallest limit at which the replay gets past it \
(2 MiB steps; rounded up, where peaks are rounded to the nearest).",
        )?;
    } else {
        note(
            out,
            "frag. = 1 - allocated / reserved at the OOM, else at peak reserved; min capacity = smallest limit at \
which the run completes (2 MiB steps; rounded up, where peaks are rounded to the nearest).",
        )?;
    }
    // Each decision the table shows, defined.
    let mut shown: Vec<crate::analysis::outcome::Decision> = Vec::new();
    for r in w.rows.iter().filter(|r| !r.policy.is_recorded()) {
        if !shown.contains(&r.decision) {
            shown.push(r.decision);
        }
    }
    let defined: Vec<String> = shown.iter().map(|d| format!("{} = {}", d.short(), d.meaning())).collect();
    if !defined.is_empty() {
        note(out, &format!("decision: {}.", defined.join("; ")))?;
    }
    note(
        out,
        "a limit above the min capacity can still fail: other limits mean other segments and other pieces; replay \
the exact limit to check it.",
    )?;
    for note in w.placement_notes().into_iter().chain(w.placed_by_rule_notes()).chain(w.same_run_notes()) {
        writeln!(out, "{}", crate::model::wrap::indented(&note, "", "  "))?;
    }
    if let Some(res) = w.rows.iter().filter_map(|r| r.min_capacity_resolution_bytes).max().filter(|&r| r > (2 << 20)) {
        note(
            out,
            &format!(
                "long trace ({} events): each min capacity completes and lies within {} of the boundary (at most {} \
replays per policy).",
                w.bounds.events,
                fmt_bytes(res),
                crate::analysis::capacity_search::LONG_TRACE_PROBES
            ),
        )?;
    }
    if let Some(p) = &w.prediction {
        print_prediction(out, p, w.capacity_bytes)?;
    }
    note(
        out,
        &format!(
            "no caching (PYTORCH_NO_CUDA_MEMORY_CACHING=1) costs about {:.0} ms of device calls ({DEVICE_CALL_US:.0} \
us each on an H100).",
            b.no_caching_device_calls as f64 * DEVICE_CALL_US / 1000.0
        ),
    )?;
    if let Some(n) = w.capacity_bytes.and_then(|c| w.no_caching().limit_note(c)) {
        note(out, &format!("no caching: {n}"))?;
    }
    Ok(())
}

/// What the whole job would need, where the trace can tell.
pub fn print_prediction(
    out: &mut dyn Write,
    p: &crate::analysis::outcome::JobPrediction,
    capacity: Option<u64>,
) -> std::io::Result<()> {
    use crate::analysis::outcome::JobPrediction;
    let cap = crate::model::units::fmt_limit(capacity);
    writeln!(out, "{}", crate::model::wrap::indented(&format!("the whole job: {}", p.basis()), "", "  "))?;
    if let JobPrediction::FromRepeatedIteration { policies, .. } = p {
        writeln!(out, "  at {cap}:")?;
        for q in policies {
            writeln!(out, "  {:<36} {}", q.policy, p.outlook(q, capacity).short())?;
        }
    }
    Ok(())
}

pub fn run(opts: &WhatifCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let trace = match super::open_analysable(&opts.trace, &opts.facts, opts.json, out)? {
        Ok(trace) => trace,
        Err(code) => return Ok(code),
    };
    // Default: the trace's limit, or the one its first OOM implies (the same resolution as replay).
    let capacity = trace.capacity(opts.capacity_bytes, false);
    let w = whatif(
        &trace,
        &WhatifOptions { capacity, search_capacity: opts.search_capacity, repeats: opts.repeats, rows_only: false },
    )?;
    if opts.json {
        write_json(out, &w)?;
    } else {
        print_table(&mut crate::model::wrap::ScreenWriter::new(out), &w)?;
    }
    damage_exit(&[&trace])
}
