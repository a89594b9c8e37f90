//! `alloctrace explain TRACE [--json]`: the OOM doctor.

use super::{exit, write_json};
use crate::analysis::explain::{explain_with, ExplainOptions, ExplainReport};
use crate::model::escape::terminal;
use crate::model::units::{fmt_bytes, fmt_need, fmt_ns};
use crate::replay::Reach;
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct ExplainCmdOptions {
    pub trace: PathBuf,
    /// What the user says about the run (limit, settings, device of a snapshot).
    pub facts: crate::source::input::RunFacts,
    /// Iterations appended to predict the rest of a job that ran out of memory.
    pub repeats: u32,
    pub json: bool,
    /// Everything behind the verdict (the default text fits a screen).
    pub verbose: bool,
}

/// The default text: the verdict, the fix and its evidence, what is worth trying, in one screen
/// (at most 40 lines of 100 columns on the shipped traces; a test holds it).
/// Lines of `explain`'s text without `--verbose`: what fits a screen.
pub const SHORT_LINES: usize = 40;

pub fn print_short(out: &mut dyn Write, r: &ExplainReport) -> std::io::Result<()> {
    // The call sites holding most of the memory, and where the phases came from, are said where
    // the screen has room for them.
    let mut full = Vec::new();
    print_short_with(&mut full, r, true)?;
    if String::from_utf8_lossy(&full).lines().count() <= SHORT_LINES {
        return out.write_all(&full);
    }
    print_short_with(out, r, false)
}

/// The text without `--verbose`; `full`: with the lines that go first when it would not fit.
/// Strings of the trace's (call sites, settings, marks) are escaped where a line is formatted:
/// sentences by [`crate::model::wrap::indented`], anything else with [`terminal`].
fn print_short_with(out: &mut dyn Write, r: &ExplainReport, full: bool) -> std::io::Result<()> {
    let b = fmt_bytes;
    let f = &r.figures;
    let cap = match f.capacity_bytes {
        Some(_) => format!("limit: {}", crate::model::Capacity::of(f.capacity_bytes, r.capacity_source).text()),
        None => crate::model::units::fmt_limit(None),
    };
    let settings = if r.alloc_conf.is_empty() { "defaults" } else { &r.alloc_conf };
    writeln!(
        out,
        "{}",
        crate::model::wrap::indented(
            &match r.capacity_source {
                crate::model::CapacitySource::None => format!("explain {} (settings: {settings}; no limit)", r.trace),
                source => format!(
                    "explain {} (settings: {settings}; limit: {})",
                    r.trace,
                    crate::model::Capacity::of(f.capacity_bytes, source).text()
                ),
            },
            "",
            "  "
        )
    )?;
    if let Some(p) = &r.predicted {
        writeln!(out, "{}", crate::model::wrap::indented(p, "", "  "))?;
    }
    if let Some(d) = &r.input_damage {
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(
                &format!("partial input: {d}; everything below covers only what was read"),
                "",
                "  "
            )
        )?;
    }
    if let Some(n) = &r.capacity_note {
        writeln!(out, "{}", crate::model::wrap::indented(&format!("note: {n}"), "", "  "))?;
    }
    if r.moment == "oom" {
        if let Some(m) = &r.pytorch_message {
            let head = match r.pytorch_message_note.as_ref().filter(|_| full) {
                Some(n) => {
                    format!("out of memory at event {}. PyTorch's message, restated from the figures ({n}):", f.event)
                }
                None => format!("out of memory at event {}. PyTorch's message, restated from the figures:", f.event),
            };
            writeln!(out, "{}", crate::model::wrap::indented(&head, "", "  "))?;
            // The short text leaves out the link to PyTorch's documentation that ends it.
            let m = if full {
                m.as_str()
            } else {
                m.strip_suffix(crate::analysis::explain::PYTORCH_MESSAGE_LINK).unwrap_or(m)
            };
            writeln!(out, "{}", crate::model::wrap::indented(m, "  ", "  "))?;
        }
        if let Some(w) = &r.predicted_where {
            writeln!(
                out,
                "{}",
                crate::model::wrap::indented(&format!("the failing request (predicted): {w}"), "", "  ")
            )?;
        }
    } else {
        let head = match r.reach {
            Reach::GetsPastFailure => format!(
                "no out-of-memory ({cap}): the replay gets past the request that failed in the recording. The \
peak of reserved memory is at event {} ({}).",
                f.event,
                b(f.reserved_bytes)
            ),
            // A damaged input: what came after the damage may have failed.
            _ if r.input_damage.is_some() => format!(
                "no out-of-memory in the events read ({cap}); the peak of reserved memory among them is at event {} \
({}).",
                f.event,
                b(f.reserved_bytes)
            ),
            _ => format!(
                "no out-of-memory ({cap}); the peak of reserved memory is at event {} ({}).",
                f.event,
                b(f.reserved_bytes)
            ),
        };
        // Out-of-memory errors the program caught and went on from are not the moment (the
        // replay goes on past them, as the run did), but they are what a user came to ask about.
        let caught: Vec<&crate::model::RecordedOom> = r.recorded_ooms.iter().filter(|o| o.caught).collect();
        let caught_line = caught.first().map(|first| {
            format!(
                "the program caught {} and went on (the first at event {}, a {} request); the replay \
                 goes past {}, as the run did",
                crate::model::units::count(caught.len() as u64, "out-of-memory error"),
                first.event,
                b(first.requested_bytes),
                if caught.len() == 1 { "it" } else { "them" }
            )
        });
        writeln!(out, "{}", crate::model::wrap::indented(&head, "", "  "))?;
        if let Some(line) = caught_line {
            writeln!(out, "{}", crate::model::wrap::indented(&line, "", "  "))?;
        }
    }
    writeln!(out, "verdict: {}", r.verdict.kind.as_str())?;
    writeln!(out, "{}", crate::model::wrap::indented(&r.verdict.reason, "  ", "  "))?;
    print_categories(out, r, full)?;
    // Where the memory of the moment was allocated, where the trace has call sites (the two
    // sites holding most; --verbose lists them with the user's line).
    let named: Vec<String> = r
        .top_sites
        .iter()
        .filter(|s| full && !s.site.label.starts_with('('))
        .take(2)
        .map(|s| format!("{} from {}", b(s.block_bytes), s.site.frame_label()))
        .collect();
    if !named.is_empty() {
        writeln!(out, "{}", crate::model::wrap::indented(&named.join("; "), "  most held: ", "    "))?;
    }
    match &r.fix {
        Some(fix) => {
            writeln!(out, "{}", crate::model::wrap::indented(&fix.text, &format!("{}: ", fix.label()), "  "))?;
            writeln!(out, "{}", crate::model::wrap::indented(&format!("because {}", fix.evidence), "  ", "  "))?;
        }
        None if r.moment == "oom" => writeln!(out, "fix: none that a replay proves")?,
        None => {}
    }
    for a in r.also() {
        writeln!(out, "{}", crate::model::wrap::indented(&a.text, "also: ", "  "))?;
    }
    // The setting the fix names is shown above, with its evidence.
    let more: Vec<_> = r
        .worth_trying
        .iter()
        .filter(|w| r.fix.as_ref().is_none_or(|f| f.setting.as_deref() != Some(&w.setting)))
        .collect();
    if !more.is_empty() {
        // Where every figure holds only if later iterations ask no more, that is said once.
        let alike = r.prediction.as_ref().is_some_and(|p| p.alike_unknown());
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(
                &format!(
                    "worth trying (a replay shows each may get through; none is proven to fit{}):",
                    if alike { "; the whole job's figures hold if later iterations ask no more" } else { "" }
                ),
                "",
                "  "
            )
        )?;
        for w in more {
            let predicted = match (alike, w.predicted_needs_bytes, &w.whole_job_short) {
                (true, Some(n), _) => format!("; the whole job: about {}", fmt_need(n)),
                (_, _, Some(c)) => format!("; the whole job: {c}"),
                _ => String::new(),
            };
            let from = w.gets_past_from_bytes.map(|m| format!(" (gets past from {})", fmt_need(m))).unwrap_or_default();
            // The settings as the not-advised lines name them: the fix above shows the variable.
            let setting = w.setting.strip_prefix("PYTORCH_CUDA_ALLOC_CONF=").unwrap_or(&w.setting);
            writeln!(out, "  {}{from}{predicted}", terminal(setting))?;
        }
    }
    for n in &r.not_advised {
        writeln!(out, "{}", crate::model::wrap::indented(n, "not advised: ", "  "))?;
    }
    for n in &r.cannot_tell {
        writeln!(out, "{}", crate::model::wrap::indented(n, "cannot tell: ", "  "))?;
    }
    if let Some(p) = r
        .prediction
        .as_ref()
        .filter(|_| !r.worth_trying.is_empty() || r.advice.iter().any(|a| !a.proven))
        .filter(|p| !r.fix.as_ref().is_some_and(|f| f.evidence.contains(&p.basis())))
    {
        // Short of room, without what was taken as one-time state (--verbose says it).
        let basis = if full { p.basis() } else { p.basis_short() };
        writeln!(out, "{}", crate::model::wrap::indented(&format!("the whole job: {basis}"), "", "  "))?;
    }
    if r.moment == "oom" && r.prediction.is_some() {
        let (limit, exact) = f.capacity_bytes.map(crate::model::units::capacity_arg).unwrap_or(("LIMIT".into(), true));
        // A full device cannot serve past its own memory: the whole job needs a larger one.
        let larger = if r.capacity_source == crate::model::CapacitySource::InferredFromOom {
            " on a GPU with more memory"
        } else {
            ""
        };
        let rounded = if exact { "" } else { " (the limit rounded down)" };
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(
                &format!(
                    "the whole job at this limit{larger}: alloctrace record --capacity {limit} -o run.atrace -- python \
                     train.py{rounded}"
                ),
                "",
                "  "
            )
        )?;
    }
    writeln!(out, "(--verbose: the figures, call sites, what-if table, growth and patterns; --json: all of it)")?;
    Ok(())
}

/// What the memory at the moment is for, and the checkpointing estimate, under the verdict.
/// `source`: with where the phases came from.
fn print_categories(out: &mut dyn Write, r: &ExplainReport, source: bool) -> std::io::Result<()> {
    if let Some(c) = &r.categories {
        let at = if r.moment == "oom" { "at the OOM" } else { "at that peak" };
        let from = if source {
            format!(" (phases from {})", crate::analysis::category::phases_from_text(c.phases_from))
        } else {
            String::new()
        };
        let text = format!("{at}: {}{from}", c.bytes.shares_text());
        writeln!(out, "{}", crate::model::wrap::indented(&text, "  ", "    "))?;
        if let Some(k) = &c.checkpointing {
            let text = format!("checkpointing (an estimate): {}", crate::analysis::category::checkpoint_text(k));
            writeln!(out, "{}", crate::model::wrap::indented(&text, "  ", "    "))?;
        }
    }
    Ok(())
}

pub fn print_report(out: &mut dyn Write, r: &ExplainReport) -> std::io::Result<()> {
    let b = fmt_bytes;
    let f = &r.figures;
    writeln!(out, "explain {}", terminal(&r.trace))?;
    writeln!(out, "settings {}", if r.alloc_conf.is_empty() { "(defaults)".into() } else { terminal(&r.alloc_conf) })?;
    // The limit every figure and replay below is at, with where it came from.
    writeln!(out, "limit    {}", crate::model::Capacity::of(f.capacity_bytes, r.capacity_source).text())?;
    if let Some(d) = &r.input_damage {
        writeln!(out, "partial input: {d}; everything below covers only what was read")?;
    }
    if !r.recorded_ooms.is_empty() {
        // The first few (a cuDNN search can fail 100 times): --json lists them all.
        const SHOWN: usize = 6;
        let mut at: Vec<String> = r
            .recorded_ooms
            .iter()
            .take(SHOWN)
            .map(|o| format!("event {} ({})", o.event, b(o.requested_bytes)))
            .collect();
        if r.recorded_ooms.len() > SHOWN {
            at.push(format!("and {} more (--json lists them)", r.recorded_ooms.len() - SHOWN));
        }
        let n = crate::model::units::count(r.recorded_ooms.len() as u64, "out-of-memory error");
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(&format!("the trace recorded {n}: {}", at.join(", ")), "", "  ")
        )?;
    }
    if let Some(n) = &r.capacity_note {
        writeln!(out, "{}", crate::model::wrap::indented(&format!("note: {n}"), "", "  "))?;
    }
    writeln!(out)?;
    if r.moment == "oom" {
        // The trace does not hold the text PyTorch printed: it is restated from the figures.
        writeln!(out, "out of memory at event {} ({}). PyTorch's message would read:", f.event, fmt_ns(f.time_ns))?;
        if let Some(m) = &r.pytorch_message {
            writeln!(out, "{}", crate::model::wrap::indented(m, "  ", "  "))?;
            if let Some(n) = &r.pytorch_message_note {
                writeln!(out, "{}", crate::model::wrap::indented(&format!("({n})"), "  ", "  "))?;
            }
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
            "verdict: {} (over most of the limits the trace allows; it depends on the limit, see below)",
            r.verdict.kind.as_str()
        )?,
        _ => writeln!(out, "verdict: {}", r.verdict.kind.as_str())?,
    }
    writeln!(out, "{}", crate::model::wrap::indented(&r.verdict.reason, "  ", "  "))?;
    print_categories(out, r, true)?;
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
            terminal(&s.site.label)
        )?;
    }
    if let Some(g) = &r.growth {
        writeln!(
            out,
            "growth: {}{} live per iteration over {} iterations ({})",
            if g.per_iteration_bytes < 0.0 { "-" } else { "+" },
            b(g.per_iteration_bytes.abs() as u64),
            g.iterations(),
            terminal(&g.source)
        )?;
    }
    writeln!(out)?;
    writeln!(out, "what-if at {} (replays of the same requests):", crate::model::units::fmt_limit(f.capacity_bytes))?;
    let to = if r.prediction.is_some() { "gets past from" } else { "completes from" };
    writeln!(out, "  {:<33} {:>12} {:>12} {:>10}  {to:>14}", "setting", "outcome", "decision", "peak rsvd")?;
    for w in &r.whatif {
        writeln!(
            out,
            "  {:<33} {:>12} {:>12} {:>10}  {:>14}",
            terminal(&w.policy.to_string()),
            w.reach,
            w.decision.short(),
            b(w.peak_reserved_bytes),
            w.min_capacity_bytes.map(fmt_need).unwrap_or_else(|| "-".into())
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
        writeln!(out, "  experiment: {}: {} (peak reserved {})", e.name, e.outcome(), b(e.peak_reserved_bytes))?;
    }
    if let Some(e) = &r.empty_cache_calls {
        writeln!(out, "{}", crate::model::wrap::indented(&format!("pattern: {}", e.text()), "  ", "    "))?;
    }
    if let Some(h) = &r.held_for_streams {
        writeln!(out, "{}", crate::model::wrap::indented(&format!("pattern: {}", h.text()), "  ", "    "))?;
    }
    writeln!(out)?;
    if r.advice.is_empty() {
        writeln!(out, "advice: none that the evidence supports")?;
    } else {
        writeln!(out, "advice:")?;
        for a in &r.advice {
            writeln!(out, "{}", crate::model::wrap::indented(&a.text, "  - ", "    "))?;
            writeln!(out, "{}", crate::model::wrap::indented(&format!("because {}", a.evidence), "    ", "    "))?;
        }
    }
    if !r.worth_trying.is_empty() {
        writeln!(out, "worth trying (a replay shows each may get through; none is proven to fit):")?;
        for w in &r.worth_trying {
            writeln!(out, "{}", crate::model::wrap::indented(&format!("{}: {}", w.setting, w.text), "  - ", "    "))?;
        }
    }
    if !r.not_advised.is_empty() {
        writeln!(out, "not advised:")?;
        for n in &r.not_advised {
            writeln!(out, "{}", crate::model::wrap::indented(n, "  - ", "    "))?;
        }
    }
    if !r.cannot_tell.is_empty() {
        writeln!(out, "cannot tell:")?;
        for n in &r.cannot_tell {
            writeln!(out, "{}", crate::model::wrap::indented(n, "  - ", "    "))?;
        }
    }
    Ok(())
}

pub fn run(opts: &ExplainCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let trace = match super::open_analysable(&opts.trace, &opts.facts, opts.json, out)? {
        Ok(trace) => trace,
        Err(code) => return Ok(code),
    };
    let r = explain_with(&trace, &ExplainOptions { repeats: Some(opts.repeats), ..Default::default() })?;
    if opts.json {
        write_json(out, &r)?;
    } else {
        // Every line within the screen's width (a table row's meaning continues under itself).
        let screen = &mut crate::model::wrap::ScreenWriter::new(out);
        if opts.verbose {
            print_report(screen, &r)?;
        } else {
            print_short(screen, &r)?;
        }
        screen.flush()?;
    }
    if let Some(w) = &r.input_damage {
        crate::model::escape::warn(w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}
