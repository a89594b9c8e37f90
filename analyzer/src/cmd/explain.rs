//! `alloctrace explain TRACE [--json]`: the OOM doctor.

use super::{exit, write_json};
use crate::explain::{explain_with, ExplainOptions, ExplainReport};
use crate::units::{fmt_bytes, fmt_ns};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct ExplainCmdOptions {
    pub trace: PathBuf,
    /// What the user says about the run (limit, settings, device of a snapshot).
    pub facts: crate::input::RunFacts,
    /// Iterations appended to predict the rest of a job that ran out of memory.
    pub repeats: u32,
    pub json: bool,
}

pub fn print_report(out: &mut dyn Write, r: &ExplainReport) -> std::io::Result<()> {
    let b = fmt_bytes;
    let f = &r.figures;
    writeln!(out, "explain {}", r.trace)?;
    writeln!(out, "settings {}", if r.alloc_conf.is_empty() { "(defaults)" } else { &r.alloc_conf })?;
    if let Some(d) = &r.input_damage {
        writeln!(out, "partial input: {d}; everything below covers only what was read")?;
    }
    if !r.recorded_ooms.is_empty() {
        let at: Vec<String> =
            r.recorded_ooms.iter().map(|o| format!("event {} ({})", o.event, b(o.requested_bytes))).collect();
        writeln!(out, "the trace recorded {} out-of-memory: {}", r.recorded_ooms.len(), at.join(", "))?;
    }
    if let Some(n) = &r.capacity_note {
        writeln!(out, "note: {n}")?;
    }
    writeln!(out)?;
    if r.moment == "oom" {
        // The trace does not hold the text PyTorch printed: it is restated from the figures.
        writeln!(out, "out of memory at event {} ({}). PyTorch's message would read:", f.event, fmt_ns(f.time_ns))?;
        if let Some(m) = &r.pytorch_message {
            writeln!(out, "  {m}")?;
        }
        writeln!(out, "what the numbers mean:")?;
        writeln!(
            out,
            "  requested                {:>12}  the tensor asked for; the allocator tried to get a {} segment for it",
            b(f.requested_bytes),
            b(f.alloc_bytes)
        )?;
    } else {
        writeln!(out, "no out-of-memory; the peak of reserved memory, at event {} ({}):", f.event, fmt_ns(f.time_ns))?;
    }
    if let Some(c) = f.capacity_bytes {
        let what = if r.capacity_note.is_some() {
            "the limit assumed (see the note above)"
        } else {
            "the limit the process ran under"
        };
        writeln!(out, "  capacity                 {:>12}  {what}", b(c))?;
    }
    writeln!(out, "  allocated                {:>12}  held by live tensors (rounded blocks)", b(f.allocated_bytes))?;
    writeln!(out, "  reserved                 {:>12}  obtained from the device in segments", b(f.reserved_bytes))?;
    writeln!(
        out,
        "  reserved but unallocated {:>12}  cached: free blocks inside segments, reusable only for requests that fit in one",
        b(f.reserved_unallocated_bytes)
    )?;
    writeln!(
        out,
        "  largest free block       {:>12}  the biggest request the cache could serve",
        b(f.largest_free_bytes)
    )?;
    writeln!(out, "  wholly free segments     {:>12}  what empty_cache() could give back", b(f.releasable_bytes))?;
    if let Some(h) = f.headroom_bytes {
        writeln!(
            out,
            "  headroom                 {:>12}  capacity - reserved: what new segments may still take",
            b(h)
        )?;
    }
    if let (Some(t), Some(fr)) = (f.device_total_bytes, f.device_free_bytes) {
        writeln!(out, "  device total / free      {:>12} / {}  per the driver", b(t), b(fr))?;
    }
    if let Some(o) = f.held_outside_bytes {
        writeln!(
            out,
            "  outside the allocator    {:>12}  CUDA context, other libraries and processes (total - free - reserved)",
            b(o)
        )?;
    }
    writeln!(out)?;
    match &r.verdict_by_limit {
        Some(v) if v.iter().filter(|l| l.kind.is_some()).count() > 1 => writeln!(
            out,
            "verdict: {} (at the least limit the trace allows; it depends on the limit, see below)",
            r.verdict.kind.as_str()
        )?,
        _ => writeln!(out, "verdict: {}", r.verdict.kind.as_str())?,
    }
    writeln!(out, "  {}", r.verdict.reason)?;
    if let Some(c) = &r.categories {
        let at = if r.moment == "oom" { "at the OOM" } else { "at that peak" };
        writeln!(out, "  {at}: {} (phases from {})", c.bytes.shares_text(), c.phases_from)?;
        if let Some(k) = &c.checkpointing {
            writeln!(out, "  checkpointing (an estimate): {}", crate::category::checkpoint_text(k))?;
        }
    }
    writeln!(out)?;
    writeln!(out, "call sites holding memory at that moment:")?;
    for s in r.top_sites.iter().take(5) {
        writeln!(
            out,
            "  {:>12} in {:>5} blocks, {} segment(s) pinned alone ({})  {}",
            b(s.block_bytes),
            s.blocks,
            s.segments_pinned,
            b(s.pinned_segment_bytes),
            s.site.label
        )?;
    }
    if let Some(g) = &r.growth {
        writeln!(
            out,
            "growth: median {}{} live per iteration over {} iterations ({})",
            if g.per_iteration_bytes < 0.0 { "-" } else { "+" },
            b(g.per_iteration_bytes.abs() as u64),
            g.live_bytes.len(),
            g.source
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "what-if at {} (replays of the same requests):",
        f.capacity_bytes.map(b).unwrap_or_else(|| "no limit".into())
    )?;
    let to = if r.prediction.is_some() { "gets past the failure" } else { "completes" };
    for w in &r.whatif {
        writeln!(
            out,
            "  {:<36} {:>12}  peak reserved {:>11}  smallest capacity that {to} {}",
            w.policy,
            w.reach,
            b(w.peak_reserved_bytes),
            w.min_capacity_bytes.map(b).unwrap_or_else(|| "-".into())
        )?;
    }
    if let Some(n) = &r.capacity_search_note {
        writeln!(out, "  ({n})")?;
    }
    if let Some(p) = r.offline_plan_bytes {
        writeln!(out, "  offline plan (knows every lifetime)        {}", b(p))?;
    }
    if let Some(p) = &r.prediction {
        super::whatif::print_prediction(out, p, f.capacity_bytes)?;
    }
    for e in &r.experiments {
        writeln!(
            out,
            "  experiment: {}: {} (peak reserved {})",
            e.name,
            if e.completes { "completes" } else { "still runs out of memory" },
            b(e.peak_reserved_bytes)
        )?;
    }
    if let Some(e) = &r.empty_cache_calls {
        writeln!(out, "  pattern: {}", e.text())?;
    }
    if let Some(h) = &r.held_for_streams {
        writeln!(out, "  pattern: {}", h.text())?;
    }
    writeln!(out)?;
    if r.advice.is_empty() {
        writeln!(out, "advice: none that the evidence supports")?;
    } else {
        writeln!(out, "advice:")?;
        for a in &r.advice {
            writeln!(out, "  - {}", a.text)?;
            writeln!(out, "    because {}", a.evidence)?;
        }
    }
    if !r.not_advised.is_empty() {
        writeln!(out, "not advised:")?;
        for n in &r.not_advised {
            writeln!(out, "  - {n}")?;
        }
    }
    Ok(())
}

pub fn run(opts: &ExplainCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let trace = match super::open_analysable(&opts.trace, &opts.facts, out)? {
        Ok(trace) => trace,
        Err(code) => return Ok(code),
    };
    let r = explain_with(&trace, &ExplainOptions { repeats: Some(opts.repeats), ..Default::default() })?;
    if opts.json {
        write_json(out, &r)?;
    } else {
        print_report(out, &r)?;
    }
    if let Some(w) = &r.input_damage {
        eprintln!("alloctrace: warning: {}", crate::escape::terminal(&w.to_string()));
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}
