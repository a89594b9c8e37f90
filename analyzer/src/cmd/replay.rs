//! `alloctrace replay TRACE [--conf ...] [--capacity ...] [--json] [-o SIM.atrace]`.

use super::{exit, write_json};
use crate::model::units::fmt_bytes;
use crate::replay::{replay, Outcome, ReplayOptions, ReplayResult};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct ReplayCmdOptions {
    pub trace: PathBuf,
    /// For a PyTorch snapshot: the device whose history to read.
    pub device: usize,
    pub replay: ReplayOptions,
    /// Follow this PyTorch release's allocator instead of the trace's.
    pub torch_version: Option<recorder::engine::version::TorchVersion>,
    pub json: bool,
}

pub fn print_result(out: &mut dyn Write, r: &ReplayResult) -> std::io::Result<()> {
    let settings = if r.alloc_conf.is_empty() { "(defaults)".to_string() } else { r.alloc_conf.clone() };
    writeln!(out, "settings        {settings}")?;
    let release = if r.torch_version_assumed {
        "  (assumed: the trace names no release; --torch-version sets it)"
    } else {
        "  (the trace's release, or --torch-version)"
    };
    writeln!(out, "pytorch         {}'s allocator{release}", r.torch_version)?;
    let capacity = crate::model::Capacity::of(r.capacity_bytes, r.capacity_source);
    writeln!(out, "capacity        {}", capacity.text())?;
    if let Some(n) = capacity.note() {
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(&format!("note: {n}"), "                ", "                ")
        )?;
    }
    match &r.outcome {
        Outcome::Ok => writeln!(out, "outcome         ok ({} requests replayed)", r.requests)?,
        Outcome::Oom { event, requested_bytes, alloc_bytes, reserved_bytes, allocated_bytes, .. } => writeln!(
            out,
            "outcome         OOM at event {event}: a request of {} (segment {}) failed with {} reserved, {} allocated",
            fmt_bytes(*requested_bytes),
            fmt_bytes(*alloc_bytes),
            fmt_bytes(*reserved_bytes),
            fmt_bytes(*allocated_bytes)
        )?,
    }
    writeln!(out, "against the run  {}", r.reach.text())?;
    if let Some(m) = r.failure_may_be_caught {
        writeln!(out, "                {}", m.text())?;
    }
    if r.caught_recorded_ooms > 0 {
        writeln!(
            out,
            "                {} out-of-memory error(s) the program caught (and went on from) replayed past",
            r.caught_recorded_ooms
        )?;
    }
    if let Some(d) = &r.input_damage {
        writeln!(out, "partial input   {d}; the figures cover only what was read")?;
    }
    if let Outcome::Oom { event, .. } = &r.outcome {
        let after = r.events.saturating_sub(event + 1);
        if after > 0 {
            writeln!(
                out,
                "                the replay stops there, as a program that does not catch the error does; \
                 the trace's {after} later events were not replayed"
            )?;
        }
    }
    writeln!(out, "peak reserved   {:>12}  ({} bytes)", fmt_bytes(r.peak_reserved_bytes), r.peak_reserved_bytes)?;
    writeln!(out, "peak allocated  {:>12}  ({} bytes)", fmt_bytes(r.peak_allocated_bytes), r.peak_allocated_bytes)?;
    writeln!(out, "peak requested  {:>12}  ({} bytes)", fmt_bytes(r.peak_requested_bytes), r.peak_requested_bytes)?;
    if r.peak_reserved_bytes > 0 {
        let moment = if r.is_oom() { "at the OOM" } else { "at peak reserved" };
        writeln!(
            out,
            "fragmentation   {:>11.1}%  (reserved but unallocated {moment}: 1 - allocated / reserved)",
            r.fragmentation_where_it_matters() * 100.0
        )?;
    }
    writeln!(out, "device calls    {} allocations/maps, {} frees/unmaps", r.num_device_alloc, r.num_device_free)?;
    writeln!(
        out,
        "alloc retries   {}  (cache flushed and retried after a failed device allocation)",
        r.num_alloc_retries
    )?;
    writeln!(out, "OOMs            {}", r.num_ooms)?;
    if r.anomalies > 0 {
        writeln!(out, "anomalies       {} frees of blocks the replay does not know", r.anomalies)?;
    }
    let placed = crate::replay::placed_by_rule(r.segments_at_recorded_addresses, r.segments_placed_by_rule);
    if let Some(placed) = placed.filter(|_| r.used_recorded_addresses) {
        writeln!(
            out,
            "addresses       {placed}: {}; a trace recorded under them has the driver's own addresses",
            crate::replay::PLACED_BY_RULE_MISS
        )?;
    } else if r.used_recorded_addresses {
        writeln!(
            out,
            "addresses       the recorded segment addresses, while the replay's segment sizes follow the recorded run's \
             (the driver's placement, so the same tie-breaks)"
        )?;
    }
    Ok(())
}

pub fn run(opts: &ReplayCmdOptions, out: &mut dyn Write) -> Result<i32> {
    // The run's facts (limit, settings, release, device) are applied where every command's are:
    // a memory fraction in the settings gives the limit as it does for explain or whatif.
    let facts = crate::source::input::RunFacts {
        capacity_bytes: opts.replay.capacity_bytes,
        conf: opts.replay.config.clone(),
        device: opts.device,
        torch_version: opts.torch_version,
        least_limit: None,
    };
    let trace = super::open_input(&opts.trace, &facts, None)?;
    let r = replay(&trace, &ReplayOptions { config: None, capacity_bytes: None, ..opts.replay.clone() })?;
    if opts.json {
        write_json(out, &r)?;
    } else {
        let mut screen = crate::model::wrap::ScreenWriter::new(out);
        let out: &mut dyn Write = &mut screen;
        print_result(out, &r)?;
        if let Some(o) = &opts.replay.output {
            writeln!(out, "wrote           {}", o.display())?;
        }
    }
    if let Some(w) = &r.input_damage {
        crate::model::escape::warn(w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}
