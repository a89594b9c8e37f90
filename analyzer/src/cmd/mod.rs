//! One module per subcommand. Each takes a plain options struct (the library never sees clap;
//! the binary's `cli/` turns each command's arguments into it)
//! and writes its output to the given writer; it returns the process exit code.

pub mod diff;
pub mod dump;
pub mod explain;
pub mod export;
pub mod frag;
pub mod import;
pub mod leaks;
pub mod plot;
pub mod ranks;
pub mod record;
pub mod record_history;
pub mod replay;
pub mod report;
pub mod summary;
pub mod synth;
pub mod whatif;

/// Exit codes of `alloctrace`.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// Bad input: missing or foreign file, bad flags, unreadable trace.
    pub const ERROR: i32 = 2;
    /// The trace was damaged (truncated or corrupt): results cover what came before the damage.
    pub const PARTIAL: i32 = 3;
    /// An output would pass its stated bound (a report's file, an export): refused, nothing
    /// left at its path ([`crate::model::output::TooLarge`]).
    pub const TOO_LARGE: i32 = 3;
}

/// Writes the picture `svg` to `path` as its name asks ([`crate::model::output::picture_kind`]):
/// the SVG, or a PNG rasterized from it as the report's are; whole or not at all.
pub fn write_picture(path: &std::path::Path, svg: &str) -> anyhow::Result<()> {
    let kind = crate::model::output::picture_kind(path)?;
    crate::model::output::write_file(path, &crate::render::raster::picture_file(svg, kind)?)
}

/// The exit code after a command's output about these traces: `PARTIAL`, with the warning on
/// stderr, for each one that was damaged (its results cover what came before the damage).
pub fn damage_exit(traces: &[&crate::model::Trace]) -> anyhow::Result<i32> {
    let mut code = exit::OK;
    for t in traces {
        if let Some(w) = &t.damage() {
            crate::model::escape::warn(w);
            code = exit::PARTIAL;
        }
    }
    Ok(code)
}

pub use crate::model::output::json::{write_json, SCHEMA_VERSION, V1};

/// Opens the trace (or snapshot) an analysis reads, with what the user said about the run.
/// `Err(code)` when there is nothing to analyse: the reason, and any damage, went to `out`, and
/// the command exits with `code`.
/// With `json`, the reason is a JSON object (`trace`, `nothing_to_analyse`, `input_damage`).
/// Opens `path` as every command does ([`crate::source::input::open_with_budget`]), and where the
/// limit is inferred as a range, raises its least to the limit at which the recorded run replays
/// as recorded up to its failure ([`crate::analysis::capacity_search::least_implied_limit`]):
/// below it a request the run served fails, and a replay there would diagnose a failure that
/// never happened. A snapshot is imported again against that limit, by which its cache releases
/// are told apart.
pub fn open_input(
    path: &std::path::Path,
    facts: &crate::source::input::RunFacts,
    budget_bytes: Option<usize>,
) -> anyhow::Result<crate::model::Trace> {
    let mut trace = crate::source::input::open_with_budget(path, facts, budget_bytes)?;
    if facts.capacity_bytes.is_some() {
        return Ok(trace);
    }
    let pickle = crate::source::input::is_pickle(path);
    let read_at = |limit: u64| -> anyhow::Result<Option<crate::model::Trace>> {
        let facts = crate::source::input::RunFacts { least_limit: Some(limit), ..facts.clone() };
        Ok(if pickle { Some(crate::source::input::open_with_budget(path, &facts, budget_bytes)?) } else { None })
    };
    let Some(least) = crate::analysis::capacity_search::least_implied_limit(&trace, &read_at)? else {
        return Ok(trace);
    };
    if let Some(t) = read_at(least)? {
        return Ok(t);
    }
    trace.least_limit = Some(least);
    Ok(trace)
}

/// [`open_input`] with no facts but which device's history to read (a snapshot's), as the
/// commands that take no run flags open their inputs; `budget_bytes` is the in-memory records
/// budget of [`crate::model::Trace::open_with_budget`] for a trace (a snapshot is imported whole).
pub fn open_any(
    path: &std::path::Path,
    budget_bytes: Option<usize>,
    device: usize,
) -> anyhow::Result<crate::model::Trace> {
    open_input(path, &crate::source::input::RunFacts { device, ..Default::default() }, budget_bytes)
}

pub fn open_analysable(
    path: &std::path::Path,
    facts: &crate::source::input::RunFacts,
    json: bool,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<Result<crate::model::Trace, i32>> {
    let trace = open_input(path, facts, None)?;
    let Some(why) = crate::source::input::nothing_to_analyse(&trace) else { return Ok(Ok(trace)) };
    if json {
        #[derive(serde::Serialize)]
        struct Nothing<'a> {
            trace: String,
            nothing_to_analyse: &'a str,
            input_damage: Option<crate::model::Damage>,
        }
        write_json(
            out,
            &Nothing { trace: path.display().to_string(), nothing_to_analyse: &why, input_damage: trace.damage() },
        )?;
    } else {
        writeln!(out, "{why}")?;
        if let Some(d) = trace.damage() {
            writeln!(out, "partial input: {d}")?;
        }
    }
    if let Some(d) = trace.damage() {
        crate::model::escape::warn(d);
        return Ok(Err(exit::PARTIAL));
    }
    Ok(Err(exit::OK))
}
