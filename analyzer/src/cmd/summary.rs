//! `alloctrace summary TRACE [--json]`: what happened to GPU memory, in one screen.

use super::{exit, write_json};
use crate::model::units::{fmt_bytes, fmt_ns};
use crate::source::summary::{Peak, Summary};
use anyhow::Result;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

pub struct SummaryOptions {
    pub trace: PathBuf,
    /// What the user says about the run (a snapshot's device, the limit, the settings, the
    /// release), applied as every command applies them.
    pub facts: crate::source::input::RunFacts,
    pub json: bool,
    /// Categories whatever the trace's size (else up to [`crate::analysis::category::SUMMARY_MAX_EVENTS`]).
    pub categories: bool,
}

/// The `--json` document. Keys are stable.
#[derive(Serialize)]
pub struct SummaryJson<'a> {
    pub trace: String,
    pub source: &'static str,
    pub device_name: &'a str,
    pub device_total_bytes: u64,
    pub alloc_conf: &'a str,
    /// The PyTorch release the traced program ran, as the header names it (`null`: unknown).
    pub torch_version: Option<&'a str>,
    /// The limit the analyses run under (`null`: none), as `replay --json` gives it: the recorded
    /// one, else one inferred from the first OOM; `capacity_source` says which.
    pub capacity_bytes: Option<u64>,
    pub capacity_source: crate::model::CapacitySource,
    pub events: u64,
    pub events_by_kind: &'a std::collections::BTreeMap<&'static str, u64>,
    pub duration_ns: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub peak_reserved_bytes: u64,
    pub peak_reserved: Peak,
    pub peak_requested_bytes: u64,
    pub peak_requested: Peak,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_allocated: Option<Peak>,
    pub end_reserved_bytes: u64,
    pub end_live_blocks: u64,
    pub dropped_events: u64,
    pub anomalies: u64,
    /// Memory in CUDA graphs' and MemPools' private pools; `null` when the trace names none.
    pub private_pools: Option<&'a crate::source::summary::PrivatePools>,
    pub truncated: bool,
    pub damage: Option<String>,
    pub notes: &'a [String],
    /// Live bytes by category at the peak of allocated bytes, and each category's most;
    /// `null` when the trace has neither call sites nor phase marks.
    pub categories: Option<crate::analysis::category::Categories>,
}

pub fn run(opts: &SummaryOptions, out: &mut dyn Write) -> Result<i32> {
    // One streaming pass (no records kept: the summary needs none).
    let trace = super::open_input(&opts.trace, &opts.facts, Some(0))?;
    let scanned = trace.scanned();
    let capacity = trace.default_capacity();
    let s: &Summary = &trace.summary;
    let h = &scanned.header;
    let categories = crate::analysis::category::of_summary(&trace, opts.categories)?;
    if opts.json {
        write_json(
            out,
            &SummaryJson {
                trace: opts.trace.display().to_string(),
                source: h.source.as_str(),
                device_name: &h.device_name,
                device_total_bytes: h.device_total_bytes,
                alloc_conf: &h.alloc_conf,
                torch_version: Some(h.torch_version.as_str()).filter(|v| !v.is_empty()),
                capacity_bytes: capacity.bytes,
                capacity_source: capacity.source,
                events: s.events,
                events_by_kind: &s.events_by_kind,
                duration_ns: s.duration_ns,
                num_ooms: s.num_ooms,
                num_device_alloc: s.num_device_alloc,
                num_device_free: s.num_device_free,
                peak_reserved_bytes: s.peak_reserved.bytes,
                peak_reserved: s.peak_reserved,
                peak_requested_bytes: s.peak_requested.bytes,
                peak_requested: s.peak_requested,
                peak_allocated_bytes: s.peak_allocated.map(|p| p.bytes),
                peak_allocated: s.peak_allocated,
                end_reserved_bytes: s.end_reserved_bytes,
                end_live_blocks: s.end_live_blocks,
                dropped_events: s.dropped_events,
                anomalies: s.anomalies,
                private_pools: s.private_pools.as_ref(),
                truncated: scanned.end.is_partial(),
                damage: scanned.end.is_partial().then(|| scanned.end.describe()),
                notes: &h.notes,
                categories,
            },
        )?;
    } else {
        let mut screen = crate::model::wrap::ScreenWriter::new(out);
        let out: &mut dyn Write = &mut screen;
        let peak = |p: &Peak| format!("{:>12}  at event {} ({})", fmt_bytes(p.bytes), p.event, fmt_ns(p.time_ns));
        writeln!(out, "trace        {}", opts.trace.display())?;
        writeln!(out, "source       {}", h.source.as_str())?;
        if !h.device_name.is_empty() || h.device_total_bytes > 0 {
            let name = crate::model::escape::terminal(&h.device_name);
            writeln!(out, "device       {name} ({})", fmt_bytes(h.device_total_bytes))?;
        }
        let conf = crate::model::escape::terminal(&h.alloc_conf);
        writeln!(out, "settings     {}", if conf.is_empty() { "(defaults)" } else { &conf })?;
        if !h.torch_version.is_empty() {
            writeln!(out, "pytorch      {}", crate::model::escape::terminal(&h.torch_version))?;
        }
        writeln!(out, "capacity     {}", capacity.text())?;
        writeln!(out, "events       {} over {}", s.events, fmt_ns(s.duration_ns))?;
        let kinds: Vec<String> = s.events_by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(out, "  by kind    {}", kinds.join(", "))?;
        writeln!(out, "device calls {} allocations/maps, {} frees/unmaps", s.num_device_alloc, s.num_device_free)?;
        writeln!(out, "OOMs         {}", s.num_ooms)?;
        writeln!(out, "peak reserved  {}   (memory held from the device: segments)", peak(&s.peak_reserved))?;
        match &s.peak_allocated {
            Some(p) => writeln!(out, "peak allocated {}   (blocks handed out, rounded)", peak(p))?,
            None => writeln!(
                out,
                "peak allocated {:>12}  (this trace does not record block sizes; `alloctrace replay` computes it)",
                "unknown"
            )?,
        }
        writeln!(out, "peak requested {}   (bytes the program asked for)", peak(&s.peak_requested))?;
        if let Some(p) = &s.private_pools {
            writeln!(
                out,
                "private pools  {} (CUDA graphs, MemPools: their segments serve only their own pool): {} of the peak \
reserved; at most {} at once (event {}); {} at the end",
                p.pool_ids.len(),
                fmt_bytes(p.reserved_at_peak_reserved_bytes),
                fmt_bytes(p.peak_reserved.bytes),
                p.peak_reserved.event,
                fmt_bytes(p.end_reserved_bytes)
            )?;
        }
        writeln!(
            out,
            "at the end   {}, {} reserved",
            crate::model::units::count(s.end_live_blocks, "live block"),
            fmt_bytes(s.end_reserved_bytes)
        )?;
        if s.dropped_events > 0 {
            writeln!(out, "WARNING      the recorder dropped {} events; figures may be low", s.dropped_events)?;
        }
        if s.anomalies > 0 {
            writeln!(out, "anomalies    {} (frees of unknown blocks, allocations that reuse a live id)", s.anomalies)?;
        }
        for n in &h.notes {
            writeln!(out, "note         {}", crate::model::escape::terminal(n))?;
        }
        if let Some(c) = &categories {
            print_categories(out, c)?;
        }
    }
    if let Some(w) = scanned.damage_warning() {
        crate::model::escape::warn(&w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}

/// The text block of `summary`: bytes by category at the peak, and each category's most.
fn print_categories(out: &mut dyn Write, c: &crate::analysis::category::Categories) -> Result<()> {
    let total = c.at_peak.total().max(1);
    writeln!(
        out,
        "by category  at {} (event {}; phases from {}, {} forward passes):",
        c.peak_words(),
        c.peak_event,
        crate::analysis::category::phases_from_text(c.phases_from),
        c.forward_passes
    )?;
    for cat in crate::analysis::category::shown(c.max.unknown) {
        writeln!(
            out,
            "  {:<16} {:>12} {:>5.1}%   most {:>12}",
            cat.as_str(),
            fmt_bytes(c.at_peak.get(cat)),
            c.at_peak.get(cat) as f64 * 100.0 / total as f64,
            fmt_bytes(c.max.get(cat))
        )?;
    }
    if c.at_peak.unknown > 0 {
        writeln!(out, "unknown: held when the trace ended in an out-of-memory error, made in the step it cut short")?;
    }
    if let Some(k) = &c.checkpointing {
        writeln!(out, "checkpointing (an estimate): {}", crate::analysis::category::checkpoint_text(k))?;
    }
    Ok(())
}
