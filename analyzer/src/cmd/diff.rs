//! `alloctrace diff A.atrace B.atrace [-o DIR] [--json]`.

use super::{damage_exit, write_json};
use crate::analysis::diff::{diff, Diff};
use crate::model::escape::terminal;
use crate::model::units::{fmt_bytes, fmt_delta};
use crate::render::plot::{render_overlay, timeline_data, XAxis, COLUMNS};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

pub struct DiffCmdOptions {
    pub a: PathBuf,
    pub b: PathBuf,
    /// For a PyTorch snapshot: the device whose history to read.
    pub device: usize,
    /// Write `timeline-overlay.svg` and `diff.json` here.
    pub output: Option<PathBuf>,
    pub json: bool,
}

/// Call sites printed in the text table (all are in `--json`).
pub const SHOWN_CALLSITES: usize = 15;

pub fn print_diff(out: &mut dyn Write, d: &Diff) -> std::io::Result<()> {
    // Strings of the traces' (settings, call sites) stay on their line.
    let conf = |c: &str| if c.is_empty() { "(defaults)".to_string() } else { terminal(c).into_owned() };
    let cap = |s: &crate::analysis::diff::Side| {
        s.capacity_bytes
            .map(|c| format!(", capacity {} ({})", fmt_bytes(c), s.capacity_source.text()))
            .unwrap_or_default()
    };
    writeln!(out, "A  {}  {}{}", terminal(&d.a.trace), conf(&d.a.alloc_conf), cap(&d.a))?;
    writeln!(out, "B  {}  {}{}", terminal(&d.b.trace), conf(&d.b.alloc_conf), cap(&d.b))?;
    let outcome = |s: &crate::analysis::diff::Side| match s.replayed_oom_event {
        Some(e) => format!("oom at event {e}"),
        None => s.replayed_outcome.to_string(),
    };
    let outcomes = (outcome(&d.a), outcome(&d.b));
    // The columns are as wide as their widest figure (an OOM's event): 14, or up to 22 for an
    // event of nine digits, so that a line stays within 100 columns.
    let w = [14, outcomes.0.len(), outcomes.1.len()].into_iter().max().unwrap_or(14);
    writeln!(out, "{:<28} {:>w$} {:>w$} {:>w$}", "", "A", "B", "B - A")?;
    let bytes = |out: &mut dyn Write, name: &str, a: u64, b: u64| {
        writeln!(out, "{name:<28} {:>w$} {:>w$} {:>w$}", fmt_bytes(a), fmt_bytes(b), fmt_delta(b as i64 - a as i64))
    };
    let count = |out: &mut dyn Write, name: &str, a: u64, b: u64| {
        writeln!(out, "{name:<28} {a:>w$} {b:>w$} {:>+w$}", b as i64 - a as i64)
    };
    bytes(out, "peak reserved (recorded)", d.a.recorded_peak_reserved_bytes, d.b.recorded_peak_reserved_bytes)?;
    bytes(out, "peak requested", d.a.peak_requested_bytes, d.b.peak_requested_bytes)?;
    bytes(out, "peak reserved (replayed)", d.a.replayed_peak_reserved_bytes, d.b.replayed_peak_reserved_bytes)?;
    bytes(out, "peak allocated (replayed)", d.a.replayed_peak_allocated_bytes, d.b.replayed_peak_allocated_bytes)?;
    count(out, "OOMs (recorded)", d.a.recorded_ooms, d.b.recorded_ooms)?;
    writeln!(out, "{:<28} {:>w$} {:>w$}", "outcome (replayed)", outcomes.0, outcomes.1)?;
    count(out, "events", d.a.events, d.b.events)?;
    count(out, "allocations", d.a.allocations, d.b.allocations)?;
    let changed: Vec<_> =
        d.callsites.iter().filter(|c| c.delta_bytes_at_peak != 0 || c.delta_allocations != 0).collect();
    if !d.a.has_callsites && !d.b.has_callsites {
        writeln!(out, "call sites: neither trace records any")?;
    } else if changed.is_empty() {
        writeln!(out, "call sites: no change in bytes at the peak or allocation counts ({} sites)", d.callsites.len())?;
    } else {
        writeln!(out, "call sites, largest changes first (bytes live at each trace's peak of requested bytes):")?;
        writeln!(out, "{:>14} {:>12} {:>12} {:>9}  call site", "delta at peak", "A at peak", "B at peak", "d allocs")?;
        for c in changed.iter().take(SHOWN_CALLSITES) {
            // A long call site wraps under its column.
            let lead = format!(
                "{:>14} {:>12} {:>12} {:>+9}  ",
                fmt_delta(c.delta_bytes_at_peak),
                fmt_bytes(c.a_bytes_at_peak),
                fmt_bytes(c.b_bytes_at_peak),
                c.delta_allocations
            );
            writeln!(out, "{}", crate::model::wrap::under_lead(&c.callsite.label, &lead))?;
        }
        if changed.len() > SHOWN_CALLSITES {
            writeln!(out, "... {} more (see --json)", changed.len() - SHOWN_CALLSITES)?;
        }
    }
    Ok(())
}

pub fn run(opts: &DiffCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let (a, b) = (
        crate::source::input::open_any(&opts.a, None, opts.device)?,
        crate::source::input::open_any(&opts.b, None, opts.device)?,
    );
    let d = diff(&a, &b)?;
    if let Some(dir) = &opts.output {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let (ta, tb) = (timeline_data(&a, XAxis::Time, COLUMNS)?, timeline_data(&b, XAxis::Time, COLUMNS)?);
        let svg = dir.join("timeline-overlay.svg");
        crate::model::output::refuse_input(&svg, &[&opts.a, &opts.b])?;
        crate::model::output::write_file(&svg, render_overlay(&ta, &tb)?.as_bytes())?;
        let json = dir.join("diff.json");
        crate::model::output::refuse_input(&json, &[&opts.a, &opts.b])?;
        crate::model::output::write_file(&json, (serde_json::to_string_pretty(&super::V1::of(&d))? + "\n").as_bytes())?;
        if !opts.json {
            writeln!(out, "wrote {} and {}", svg.display(), json.display())?;
        }
    }
    if opts.json {
        write_json(out, &d)?;
    } else {
        print_diff(out, &d)?;
    }
    damage_exit(&[&a, &b])
}
