//! `alloctrace leaks TRACE [--at EVENT] [--json]`: live at the end, growth per iteration, and
//! what live blocks keep reserved.

use super::{exit, write_json};
use crate::analysis::leaks::{analyze, LeaksOptions, LeaksReport};
use crate::model::escape::terminal;
use crate::model::units::{fmt_bytes, fmt_ns};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct LeaksCmdOptions {
    pub trace: PathBuf,
    /// What the user says of the run (the limit, the settings, a snapshot's device, the release).
    pub facts: crate::source::input::RunFacts,
    pub at_event: Option<u64>,
    pub json: bool,
}

/// Bytes that may be fractional (per-iteration averages).
fn fmt_rate(bytes: f64) -> String {
    if bytes >= 1024.0 || bytes.fract() == 0.0 {
        fmt_bytes(bytes.round().max(0.0) as u64)
    } else {
        format!("{bytes:.1} B")
    }
}

pub fn print_report(out: &mut dyn Write, r: &LeaksReport, top: usize) -> std::io::Result<()> {
    // Strings of the trace's (call sites, an annotation naming the iterations) stay on their line.
    writeln!(out, "leaks in {}", terminal(&r.trace))?;
    writeln!(out)?;
    writeln!(
        out,
        "live at the end: {} allocations, {} requested",
        r.live_at_end_count,
        fmt_bytes(r.live_at_end_bytes)
    )?;
    for s in r.live_at_end.iter().take(top) {
        writeln!(
            out,
            "  {:>6} {:<6} {:>12}  oldest {} events / {} ago  {}",
            s.count,
            if s.count == 1 { "block" } else { "blocks" },
            fmt_bytes(s.requested_bytes),
            s.oldest_age_events,
            fmt_ns(s.oldest_age_ns),
            terminal(&s.site.label)
        )?;
    }
    writeln!(out)?;
    match &r.growth {
        Some(g) => {
            writeln!(out, "growth per iteration: iterations from {}", terminal(&g.source))?;
            let (first, last) = (g.live_bytes.first().copied().unwrap_or(0), g.live_bytes.last().copied().unwrap_or(0));
            writeln!(
                out,
                "  live bytes over {} iterations, each at the same phase: {} -> {} ({}{} per iteration)",
                g.iterations(),
                fmt_bytes(first),
                fmt_bytes(last),
                if g.per_iteration_bytes < 0.0 { "-" } else { "+" },
                fmt_rate(g.per_iteration_bytes.abs())
            )?;
            if g.one_time_bytes > 0 {
                writeln!(
                    out,
                    "  the first iteration added {} once: one-time state (an optimizer's state made on its first step, \
lazily built caches), not a leak",
                    fmt_bytes(g.one_time_bytes)
                )?;
            }
            if g.sites.is_empty() {
                writeln!(out, "  no call site grows steadily")?;
            }
            for s in g.sites.iter().take(top) {
                writeln!(
                    out,
                    "  +{:.0} allocation{}, +{} per iteration from {}  (rose in {} of {} intervals)",
                    s.per_iteration_count,
                    if s.per_iteration_count == 1.0 { "" } else { "s" },
                    fmt_rate(s.per_iteration_bytes),
                    terminal(&s.site.label),
                    s.rising_intervals,
                    s.intervals
                )?;
            }
        }
        None => {
            writeln!(out, "growth per iteration: not measured: {}", terminal(r.growth_note.as_deref().unwrap_or("")))?
        }
    }
    writeln!(out)?;
    let t = &r.retention;
    writeln!(
        out,
        "retention {}: {} reserved, {} allocated; empty_cache() would free {} now",
        match t.moment {
            "oom" => format!("at the out-of-memory (event {})", t.event),
            "end" => format!("at the end of the replay (event {})", t.event),
            _ => format!("after event {}", t.event),
        },
        fmt_bytes(t.reserved_bytes),
        fmt_bytes(t.allocated_bytes),
        fmt_bytes(t.empty_cache_now_bytes)
    )?;
    writeln!(out, "  (a segment goes back to the device only when every block in it is free)")?;
    for s in t.sites.iter().filter(|s| s.pinned_segment_bytes > 0).take(top) {
        let (blocks, bytes, frees) = (s.blocks, fmt_bytes(s.block_bytes), fmt_bytes(s.empty_cache_if_released_bytes));
        if s.site.is_known() {
            writeln!(
                out,
                "  if {} released its {blocks} block(s) ({bytes}), empty_cache() would free {frees} in all, with the \
                 {} segment(s) it alone pins",
                terminal(&s.site.label),
                s.segments_pinned
            )?;
        } else {
            // The blocks the trace cannot name: without call sites.
            writeln!(
                out,
                "  if the {blocks} block(s) without a call site ({bytes}) were freed, empty_cache() would free {frees} \
                 ({} segment(s) they alone pin)",
                s.segments_pinned
            )?;
        }
    }
    for b in t.blocks.iter().filter(|b| b.alone && b.segment_bytes > b.block_bytes).take(top.min(5)) {
        writeln!(
            out,
            "  a {} block from {} keeps a {} segment from being released",
            fmt_bytes(b.block_bytes),
            terminal(&b.site.label),
            fmt_bytes(b.segment_bytes)
        )?;
    }
    if let Some(n) = &t.note {
        writeln!(out, "  note: {n}")?;
    }
    Ok(())
}

pub fn run(opts: &LeaksCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let r = analyze(&super::open_input(&opts.trace, &opts.facts, None)?, &LeaksOptions { at_event: opts.at_event })?;
    if opts.json {
        write_json(out, &r)?;
    } else {
        print_report(&mut crate::model::wrap::ScreenWriter::new(out), &r, 10)?;
    }
    if let Some(w) = &r.input_damage {
        crate::model::escape::warn(w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}
