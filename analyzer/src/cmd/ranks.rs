//! `alloctrace ranks TRACE... [--json] [-o PICTURE.svg]`: one view across the ranks of a
//! distributed job (see [`crate::analysis::ranks`]).

use super::{damage_exit, write_json};
use crate::analysis::ranks::analyze;
use crate::model::units::{fmt_bytes, fmt_ns};
use crate::render::plot::render_ranks as render;
use anyhow::{bail, Result};
use std::io::Write;
use std::path::PathBuf;

pub struct RanksCmdOptions {
    pub traces: Vec<PathBuf>,
    pub output: Option<PathBuf>,
    pub json: bool,
}

pub fn run(opts: &RanksCmdOptions, out: &mut dyn Write) -> Result<i32> {
    if opts.traces.is_empty() {
        bail!("give one trace or snapshot per rank");
    }
    if let Some(path) = &opts.output {
        let inputs: Vec<&std::path::Path> = opts.traces.iter().map(|p| p.as_path()).collect();
        crate::model::output::refuse_input(path, &inputs)?;
        crate::model::output::check_output_file(path, &inputs, crate::model::output::picture_kind(path)?)?;
    }
    // The same file twice is one rank compared with itself: say so (the table would show no skew).
    let canonical: Vec<Option<std::path::PathBuf>> =
        opts.traces.iter().map(|p| std::fs::canonicalize(p).ok()).collect();
    for (k, c) in canonical.iter().enumerate() {
        if c.is_some() && canonical[..k].contains(c) {
            crate::model::escape::warn(format!(
                "{}: given more than once; it is one rank's trace compared with itself",
                opts.traces[k].display()
            ));
        }
    }
    let traces = opts.traces.iter().map(|p| super::open_any(p, None, 0)).collect::<Result<Vec<_>>>()?;
    let rep = analyze(&traces)?;
    if let Some(path) = &opts.output {
        super::write_picture(path, &render(&rep)?)?;
    }
    if opts.json {
        write_json(out, &rep)?;
    } else {
        let aligned = if rep.aligned_on_iterations {
            "aligned on iterations"
        } else {
            "not aligned (no iterations found in every trace)"
        };
        writeln!(
            out,
            "ranks        {}, timelines {aligned}",
            crate::model::units::count(rep.ranks.len() as u64, "trace")
        )?;
        // The traces first, then the figures: a table of names and figures side by side would
        // not fit a screen.
        for r in &rep.ranks {
            writeln!(
                out,
                "{}",
                crate::model::wrap::indented(&r.trace, &format!("  rank {:<6}", r.rank), "             ")
            )?;
        }
        writeln!(
            out,
            "{:>4} {:>11} {:>7} {:>9} {:>11} {:>7} {:>9} {:>4} {:>9} {:>9} {:>5}",
            "rank", "peak rsvd", "event", "at", "peak alloc", "event", "at", "OOMs", "frag@peak", "dev.calls", "iters"
        )?;
        for r in &rep.ranks {
            writeln!(
                out,
                "{:>4} {:>11} {:>7} {:>9} {:>11} {:>7} {:>9} {:>4} {:>8.1}% {:>9} {:>5}",
                r.rank,
                fmt_bytes(r.peak_reserved.bytes),
                r.peak_reserved.event,
                fmt_ns(r.peak_reserved.time_ns),
                fmt_bytes(r.peak_allocated.bytes),
                r.peak_allocated.event,
                fmt_ns(r.peak_allocated.time_ns),
                r.ooms,
                r.fragmentation_at_peak * 100.0,
                r.device_allocs + r.device_frees,
                r.iterations
            )?;
        }
        if rep.ranks.len() > 1
            && rep.ranks.iter().any(|r| r.rank_source == crate::analysis::ranks::RankSource::Position)
        {
            writeln!(
                out,
                "note         ranks by position on the command line: the files name no rank, or two name the same one"
            )?;
        }
        if rep.ranks.iter().any(|r| !r.block_sizes_recorded) {
            writeln!(
                out,
                "note         where block sizes are not recorded, allocated = requests rounded up to 512 bytes"
            )?;
        }
        let peak = rep.ranks.iter().find(|r| r.rank == rep.peaking_rank);
        let one = rep.ranks.len() == 1;
        if one {
            writeln!(
                out,
                "note         one rank: its figures, nothing to compare (give one trace or snapshot per rank)"
            )?;
        }
        if let Some(p) = peak.filter(|_| !one) {
            writeln!(
                out,
                "peaking rank {}: {} reserved at its peak; skew (max/median) {:.2}x reserved, {:.2}x allocated",
                p.rank,
                fmt_bytes(p.peak_reserved.bytes),
                rep.skew_reserved,
                rep.skew_allocated
            )?;
        }
        if rep.ranks.iter().any(|r| r.categories_at_peak.is_some()) {
            writeln!(out, "by category at each rank's peak of allocated bytes:")?;
            let unknown = rep.ranks.iter().filter_map(|r| r.categories_at_peak.map(|c| c.unknown)).max().unwrap_or(0);
            let shown: Vec<_> = crate::analysis::category::shown(unknown).collect();
            let names: Vec<String> = shown.iter().map(|c| format!(" {:>15}", c.as_str())).collect();
            writeln!(out, "rank{}", names.join(""))?;
            for r in &rep.ranks {
                let cols: Vec<String> = match &r.categories_at_peak {
                    Some(c) => shown.iter().map(|&k| format!(" {:>15}", fmt_bytes(c.get(k)))).collect(),
                    None => vec![format!(" {:>15}", "(no phases)")],
                };
                writeln!(out, "{:>4}{}", r.rank, cols.join(""))?;
            }
        }
        if one {
        } else if rep.differing_sites.is_empty() {
            writeln!(out, "call sites   the ranks hold the same bytes per call site at their peaks")?;
        } else {
            writeln!(out, "call sites whose bytes at the peak differ most between ranks:")?;
            let heads: Vec<String> = rep.ranks.iter().map(|r| format!("{:>11}", format!("rank {}", r.rank))).collect();
            writeln!(out, "  {} {:>11}  site", heads.join(" "), "spread")?;
            for s in &rep.differing_sites {
                let cols: Vec<String> = s.bytes.iter().map(|b| format!("{:>11}", fmt_bytes(*b))).collect();
                // A long site wraps under its column.
                let lead = format!("  {} {:>11}  ", cols.join(" "), fmt_bytes(s.spread_bytes));
                writeln!(out, "{}", crate::model::wrap::under_lead(&s.site.label, &lead))?;
            }
        }
        if let Some(path) = &opts.output {
            writeln!(out, "wrote        {}", path.display())?;
        }
    }
    damage_exit(&traces.iter().collect::<Vec<_>>())
}
