//! `alloctrace diff A.atrace B.atrace [-o DIR] [--json]`.

use super::{damage_exit, write_json};
use crate::analysis::diff::{diff, Diff};
use crate::analysis::picture::{timeline_data, XAxis, COLUMNS};
use crate::model::escape::terminal;
use crate::model::units::{fmt_bytes, fmt_delta};
use crate::render::plot::render_overlay;
use anyhow::{bail, Context, Result};
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
            .map(|_| format!(", capacity {}", crate::model::Capacity::of(s.capacity_bytes, s.capacity_source).text()))
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
    } else if d.a.has_callsites != d.b.has_callsites {
        // One side's bytes would all move to "(no call site recorded)": a difference of
        // recording, not of the program.
        let (with, without) = if d.a.has_callsites { ("A", "B") } else { ("B", "A") };
        writeln!(
            out,
            "call sites: only {with} records them ({without} was recorded without stacks), so none are compared"
        )?;
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
    use crate::model::output::{check_output_file, Kind};
    // Both outputs are checked before anything is read or written: neither is an input, and a
    // file already there is one `diff` could have written (not the user's notes).
    let outputs = opts.output.as_ref().map(|dir| (dir.join("timeline-overlay.svg"), dir.join("diff.json")));
    if let (Some(dir), Some((svg, json))) = (&opts.output, &outputs) {
        if dir.is_file() {
            bail!("{}: is a file; -o names a folder for timeline-overlay.svg and diff.json", dir.display());
        }
        check_output_file(svg, &[&opts.a, &opts.b], Kind::Svg)?;
        check_output_file(json, &[&opts.a, &opts.b], Kind::Json)?;
    }
    let (a, b) = (super::open_any(&opts.a, None, opts.device)?, super::open_any(&opts.b, None, opts.device)?);
    let d = diff(&a, &b)?;
    if let (Some(dir), Some((svg, json))) = (&opts.output, &outputs) {
        let (ta, tb) = (timeline_data(&a, XAxis::Time, COLUMNS)?, timeline_data(&b, XAxis::Time, COLUMNS)?);
        let overlay = render_overlay(&ta, &tb)?;
        let summary = serde_json::to_string_pretty(&super::V1::of(&d))? + "\n";
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        crate::model::output::write_file(svg, overlay.as_bytes())?;
        crate::model::output::write_file(json, summary.as_bytes())?;
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
