//! `alloctrace plot TRACE --kind timeline|segments|whatif|frag -o FILE.svg`.

use super::{damage_exit, write_json};
use crate::analysis::moment::At;
use crate::analysis::picture::{frag_data, segments_data, stacked_data, timeline_data, whatif_data, XAxis, COLUMNS};
use crate::model::units::fmt_bytes;
use crate::model::Trace;
use crate::render::plot::{render_frag, render_segments, render_stacked, render_timeline, render_whatif};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct PlotCmdOptions {
    pub trace: PathBuf,
    /// What the user says about the run: the limit, the settings, the release, a snapshot's
    /// device. Every picture replays under them.
    pub facts: crate::source::input::RunFacts,
    pub kind: Kind,
    pub output: PathBuf,
    pub at: At,
    pub stacked: bool,
    pub x: XAxis,
    pub json: bool,
}

pub fn run(opts: &PlotCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let started = std::time::Instant::now();
    // The input named as the output first: that is the mistake to name, whatever its extension.
    crate::model::output::refuse_input(&opts.output, &[&opts.trace])?;
    let kind = crate::model::output::picture_kind(&opts.output)?;
    crate::model::output::check_output_file(&opts.output, &[&opts.trace], kind)?;
    let trace = super::open_input(&opts.trace, &opts.facts, None)?;
    let (svg, drawn) = plot(&trace, opts.kind, opts.at, opts.stacked, opts.x)?;
    super::write_picture(&opts.output, &svg)?;
    if opts.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            output: String,
            #[serde(flatten)]
            drawn: &'a Drawn,
            /// `null`, or where the input was damaged: the picture covers what came before.
            input_damage: Option<crate::model::Damage>,
        }
        write_json(
            out,
            &Out { output: opts.output.display().to_string(), drawn: &drawn, input_damage: trace.damage() },
        )?;
    } else {
        let folded = if drawn.columns > 0 {
            format!(", {} events in {} columns", drawn.events, drawn.columns)
        } else {
            format!(", layout after event {}", drawn.events.saturating_sub(1))
        };
        writeln!(
            out,
            "wrote {} ({} {}{folded}, {:.2} s)",
            opts.output.display(),
            drawn.kind,
            fmt_bytes(drawn.svg_bytes),
            started.elapsed().as_secs_f64()
        )?;
    }
    damage_exit(&[&trace])
}

/// The kinds of `alloctrace plot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Timeline,
    Segments,
    Whatif,
    Frag,
}

/// What `plot` drew, for its output line and `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Drawn {
    pub kind: &'static str,
    pub svg_bytes: u64,
    /// Events folded, and the columns they were downsampled into (0 for a segment map).
    pub events: u64,
    pub columns: u64,
}

/// Computes and draws one picture.
pub fn plot(trace: &Trace, kind: Kind, at: At, stacked: bool, x: XAxis) -> Result<(String, Drawn)> {
    let (svg, name, events, columns) = match (kind, stacked) {
        (Kind::Timeline, false) => {
            let d = timeline_data(trace, x, COLUMNS)?;
            (render_timeline(&d)?, "timeline", d.series.samples, d.series.columns() as u64)
        }
        (Kind::Timeline, true) => {
            let d = stacked_data(trace, x, COLUMNS)?;
            (render_stacked(&d)?, "timeline-stacked", d.series.samples, d.series.columns() as u64)
        }
        (Kind::Segments, _) => {
            let d = segments_data(trace, at)?;
            (render_segments(&d)?, "segments", d.event + 1, 0)
        }
        (Kind::Whatif, _) => {
            let d = whatif_data(trace, x, COLUMNS)?;
            (render_whatif(&d)?, "whatif", d.requested.samples, d.requested.columns() as u64)
        }
        (Kind::Frag, _) => {
            let d = frag_data(trace, x, COLUMNS)?;
            (render_frag(&d)?, "frag", d.unallocated.samples, d.unallocated.columns() as u64)
        }
    };
    let drawn = Drawn { kind: name, svg_bytes: svg.len() as u64, events, columns };
    Ok((svg, drawn))
}
