//! `alloctrace frag TRACE [--at peak|oom|end|EVENT] [--json]`: fragmentation four ways, and the
//! segment map at one moment.

use super::{exit, write_json};
use crate::analysis::frag::{analyze, FragOptions, FragReport, SegmentMap};
use crate::analysis::moment::At;
use crate::model::units::{fmt_bytes, fmt_ns, pct};
use crate::replay::Outcome;
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct FragCmdOptions {
    pub trace: PathBuf,
    /// What the user says about the run (limit, settings, device of a snapshot).
    pub facts: crate::source::input::RunFacts,
    /// `None`: the out-of-memory error the replay ran into, else the peak
    /// ([`crate::analysis::frag::analyze_where_it_matters`]).
    pub at: Option<At>,
    /// Print at most this many lines of the segment map (segments of the same shape share one).
    pub max_segments: usize,
    pub json: bool,
}

/// Tokens of a segment's block runs beyond this many are summarised.
const MAX_TOKENS: usize = 16;

/// One segment's blocks, e.g. `A 4.00 MiB | F 4.00 MiB x3`; a repeated pattern of up to four
/// runs prints once with its count: `(A 4.00 MiB | F 4.00 MiB) x230`.
pub fn block_runs(s: &SegmentMap) -> String {
    let runs: Vec<String> = s
        .blocks
        .iter()
        .map(|r| {
            let tag = match r.state {
                "allocated" => "A",
                "free" => "F",
                _ => "P",
            };
            if r.count > 1 {
                format!("{tag} {} x{}", fmt_bytes(r.bytes), r.count)
            } else {
                format!("{tag} {}", fmt_bytes(r.bytes))
            }
        })
        .collect();
    let mut tokens: Vec<String> = Vec::new();
    let mut i = 0;
    while i < runs.len() {
        let mut best: Option<(usize, usize)> = None; // (pattern length, repeats)
        for len in 2..=4 {
            let mut k = 1;
            while i + (k + 1) * len <= runs.len() && runs[i..i + len] == runs[i + k * len..i + (k + 1) * len] {
                k += 1;
            }
            if k >= 3 && best.is_none_or(|(l, n)| k * len > l * n) {
                best = Some((len, k));
            }
        }
        match best {
            Some((len, k)) => {
                tokens.push(format!("({}) x{k}", runs[i..i + len].join(" | ")));
                i += len * k;
            }
            None => {
                tokens.push(runs[i].clone());
                i += 1;
            }
        }
    }
    if tokens.len() > MAX_TOKENS {
        let rest = tokens.len() - MAX_TOKENS;
        tokens.truncate(MAX_TOKENS);
        tokens.push(format!("... {rest} more runs"));
    }
    tokens.join(" | ")
}

/// The segment map: segments of the same shape (size, pool, stream, block runs) share a line,
/// in order of their first address. Beyond `max_lines` shapes the rest are counted, but the
/// segment that holds the largest free block (the picture of fragmentation: no request larger
/// than it can be served without a new segment) is always printed.
pub fn print_segment_map(
    out: &mut dyn Write,
    segments: &[SegmentMap],
    max_lines: usize,
    streams: &crate::model::streams::StreamNames,
) -> std::io::Result<()> {
    let mut shapes: Vec<(&SegmentMap, usize)> = Vec::new();
    for s in segments {
        match shapes.iter_mut().find(|(first, _)| first.same_shape(s)) {
            Some((_, n)) => *n += 1,
            None => shapes.push((s, 1)),
        }
    }
    // Where not every shape fits the lines, those whose segments hold the largest free blocks
    // (the picture of why a request does not fit), in address order.
    let mut shown: Vec<usize> = (0..shapes.len()).collect();
    if shapes.len() > max_lines {
        shown.sort_by(|&i, &j| shapes[j].0.largest_free_bytes.cmp(&shapes[i].0.largest_free_bytes).then(i.cmp(&j)));
        shown.truncate(max_lines);
        shown.sort_unstable();
    }
    for &k in &shown {
        let (s, n) = shapes[k];
        let times = if n > 1 { format!(" (x{n} segments like it)") } else { String::new() };
        writeln!(
            out,
            "  {:#014x} {:>10} {:<5} {}{}{}{}: {}   largest free {}",
            s.addr,
            fmt_bytes(s.bytes),
            s.pool.as_str(),
            streams.name(s.stream),
            if s.is_expandable { " expandable" } else { "" },
            // A private pool's free blocks serve only its own requests: the figures above
            // (largest free block overall) leave them out.
            if s.in_private_pool() { format!(" private pool {:?}", s.pool_id) } else { String::new() },
            times,
            block_runs(s),
            fmt_bytes(s.largest_free_bytes)
        )?;
    }
    if shown.len() < shapes.len() {
        let rest: usize = shapes.iter().enumerate().filter(|(k, _)| !shown.contains(k)).map(|(_, (_, n))| n).sum();
        let least = shown.iter().map(|&k| shapes[k].0.largest_free_bytes).min().unwrap_or(0);
        writeln!(
            out,
            "{}",
            crate::model::wrap::indented(
                &format!(
                    "... {rest} more segments of {} other shapes, each with a largest free block of at most {} \
(--max-segments N shows more; --json lists them all)",
                    shapes.len() - shown.len(),
                    fmt_bytes(least)
                ),
                "  ",
                "    "
            )
        )?;
    }
    Ok(())
}

pub fn print_report(
    out: &mut dyn Write,
    r: &FragReport,
    max_segments: usize,
    streams: &crate::model::streams::StreamNames,
) -> std::io::Result<()> {
    writeln!(out, "fragmentation of {}", r.trace)?;
    writeln!(
        out,
        "replayed under {} with {}: {}",
        if r.alloc_conf.is_empty() { "the default settings" } else { &r.alloc_conf },
        match r.capacity_bytes {
            // The capacity as every command says it: with where it came from.
            Some(_) => format!("capacity {}", crate::model::Capacity::of(r.capacity_bytes, r.capacity_source).text()),
            None => crate::model::units::fmt_limit(None),
        },
        match &r.replay_outcome {
            Outcome::Ok => format!("completed, {} events", r.events),
            Outcome::Oom { event, requested_bytes, .. } =>
                format!("out of memory at event {event} (a request of {})", fmt_bytes(*requested_bytes)),
        }
    )?;
    let placed = crate::replay::placed_by_rule(r.segments_at_recorded_addresses, r.segments_placed_by_rule);
    if let Some(placed) = placed.filter(|_| r.used_recorded_addresses) {
        writeln!(out, "layout: {placed}, so blocks may sit otherwise than in a real run under these settings")?;
    } else if r.used_recorded_addresses {
        writeln!(
            out,
            "layout: the recorded segment addresses were reused, so blocks sit where they sat in the real run"
        )?;
    }
    writeln!(out)?;
    let m = &r.moment;
    let what = match m.at {
        At::Peak => "at peak reserved".to_string(),
        At::Oom => "at the out-of-memory".to_string(),
        // A replay that runs out of memory stops there: its end is the failure, not the trace's.
        At::End if r.moment.replay_stopped => "at the end of the replay, which stops at its out-of-memory".to_string(),
        At::End => "at the end".to_string(),
        At::Event(_) => "at the chosen event".to_string(),
    };
    let lm = &m.measures;
    writeln!(
        out,
        "{what}: event {} ({}), {} reserved in {} segments, {} allocated, {} free inside segments",
        m.event,
        fmt_ns(m.time_ns),
        fmt_bytes(lm.reserved_bytes),
        lm.segments,
        fmt_bytes(lm.allocated_bytes),
        fmt_bytes(lm.free_bytes)
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<24} {:>9} {:>12} {:>9} {:>9} {:>9}  (max at event)",
        "measure", "now", "bytes now", "at peak", "mean", "max"
    )?;
    for x in &r.measures {
        writeln!(
            out,
            "{:<24} {:>9} {:>12} {:>9} {:>9} {:>9}  ({})",
            x.name,
            pct(x.at_moment),
            fmt_bytes(x.at_moment_bytes),
            pct(x.at_peak),
            pct(x.mean),
            pct(x.max),
            x.max_event
        )?;
    }
    let p = &r.plan;
    match (p.offline_plan_bytes, p.gap) {
        (Some(plan), Some(gap)) => writeln!(
            out,
            "{:<24} {:>9} {:>12}  peak reserved {} vs offline plan {}",
            "gap_to_offline_plan",
            pct(gap),
            fmt_bytes(p.peak_reserved_bytes.saturating_sub(plan)),
            fmt_bytes(p.peak_reserved_bytes),
            fmt_bytes(plan)
        )?,
        _ => writeln!(out, "{:<24} {:>9}  {}", "gap_to_offline_plan", "-", p.note.as_deref().unwrap_or(""))?,
    }
    writeln!(out)?;
    for x in &r.measures {
        writeln!(out, "  {:<22} = {}", x.name, x.definition)?;
    }
    writeln!(
        out,
        "  {:<22} = 1 - offline plan / peak reserved: waste against a planner that knows every lifetime (greedy by size)",
        "gap_to_offline_plan"
    )?;
    if let Some(n) = &p.note {
        writeln!(out, "  note: {n}")?;
    }
    writeln!(
        out,
        "  over time: {} samples over {} events; peak reserved first reached at event {}",
        r.samples, r.events, r.peak_event
    )?;
    writeln!(out)?;
    if let Some(f) = &m.failed_request {
        writeln!(
            out,
            "the failed request: {} (the allocator tried to get a segment of {}). It needs one contiguous block; \
the largest free block is {}{}.",
            fmt_bytes(f.requested_bytes),
            fmt_bytes(f.alloc_bytes),
            fmt_bytes(f.largest_free_bytes),
            f.headroom_bytes
                .map(|h| format!(", and the device could give only {} more under the capacity", fmt_bytes(h)))
                .unwrap_or_default()
        )?;
        writeln!(
            out,
            "  free in total: {} inside segments + {} headroom = {}",
            fmt_bytes(lm.free_bytes),
            fmt_bytes(f.headroom_bytes.unwrap_or(0)),
            fmt_bytes(lm.free_bytes + f.headroom_bytes.unwrap_or(0))
        )?;
        writeln!(out)?;
    }
    writeln!(
        out,
        "segment map (A allocated, F free, P freed but pending stream work; xN = N equal blocks in a row), \
largest free block overall {}{}:",
        fmt_bytes(lm.largest_free_bytes),
        if m.segments.iter().any(|s| s.in_private_pool()) { " outside private pools" } else { "" }
    )?;
    print_segment_map(out, &m.segments, max_segments, streams)?;
    if let Some(n) = streams.handles_note() {
        writeln!(out, "  ({n})")?;
    }
    if r.recorded_oom_event.is_some() && m.at != At::Oom {
        writeln!(out, "\nthis trace ends in an out-of-memory: `--at oom` shows the layout when it failed")?;
    }
    if r.anomalies > 0 {
        writeln!(out, "anomalies: {} frees of blocks the replay did not know", r.anomalies)?;
    }
    Ok(())
}

pub fn run(opts: &FragCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let trace = match super::open_analysable(&opts.trace, &opts.facts, opts.json, out)? {
        Ok(trace) => trace,
        Err(code) => return Ok(code),
    };
    let r = match opts.at {
        Some(at) => analyze(&trace, &FragOptions { at })?,
        None => crate::analysis::frag::analyze_where_it_matters(&trace, None)?,
    };
    if opts.json {
        write_json(out, &r)?;
    } else {
        print_report(&mut crate::model::wrap::ScreenWriter::new(out), &r, opts.max_segments, &trace.facts.streams)?;
    }
    if let Some(w) = &r.input_damage {
        crate::model::escape::warn(w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::frag::BlockRun;
    use recorder::trace::Pool;

    fn segment(addr: u64, allocated: u64, free: u64) -> SegmentMap {
        let mut blocks = vec![BlockRun { state: "allocated", bytes: allocated, count: 1 }];
        if free > 0 {
            blocks.push(BlockRun { state: "free", bytes: free, count: 1 });
        }
        SegmentMap {
            addr,
            bytes: allocated + free,
            pool: Pool::Large,
            pool_id: [0, 0],
            stream: 0,
            is_expandable: false,
            allocated_bytes: allocated,
            free_bytes: free,
            largest_free_bytes: free,
            blocks,
        }
    }

    /// Where not every shape fits the lines, the segments that hold the largest free blocks are
    /// printed, in address order, wherever they lie: they are the picture of the fragmentation.
    #[test]
    fn the_segments_with_the_largest_free_blocks_are_printed() {
        let mib = 1u64 << 20;
        let free = |k: u64| match k {
            8 => 6 * mib,
            3 => 4 * mib,
            _ => mib / 2,
        };
        let segments: Vec<SegmentMap> = (0..10).map(|k| segment((k + 1) << 32, (k + 1) * mib, free(k))).collect();
        let mut out = Vec::new();
        print_segment_map(&mut out, &segments, 3, &Default::default()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        // The two largest free blocks, then the first of the ties, in address order.
        assert!(lines[0].contains("0x000100000000"), "{text}");
        assert!(lines[1].contains("0x000400000000") && lines[1].ends_with("largest free 4.00 MiB"), "{text}");
        assert!(lines[2].contains("0x000900000000") && lines[2].ends_with("largest free 6.00 MiB"), "{text}");
        assert_eq!(
            format!("{} {}", lines[3], lines[4].trim()),
            "  ... 7 more segments of 7 other shapes, each with a largest free block of at most 512.00 KiB \
(--max-segments N shows more; --json lists them all)"
        );
        // Within the lines: printed in its place, nothing moved.
        let mut out = Vec::new();
        print_segment_map(&mut out, &segments, 10, &Default::default()).unwrap();
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 10);
    }
}
