//! `alloctrace dump TRACE`: one line per event, stable and greppable; the debugging view and
//! the oracle of golden tests.
//!
//! ```text
//! # source: imported-torch
//! 0 0 callsite id=1 frames=workloads.py:78:leak_list_append;...
//! 1 0 segment_alloc addr=0x7f5e00000000 bytes=2097152 stream=0 pool=small
//! 2 12000 alloc id=1 addr=0x7f5e00000000 requested=4096 block=0 stream=0 pool=small callsite=1
//! ```
//! Columns: event index, time in ns since the clock origin, kind, then `key=value` fields.
//! Addresses are hex, sizes decimal bytes. Header lines and the last line start with `#`.

use super::exit;
use crate::source::tracefile;
use anyhow::Result;
use recorder::trace::{Event, Header, Record};
use std::io::Write;
use std::path::PathBuf;

pub struct DumpOptions {
    pub trace: PathBuf,
    /// For a PyTorch snapshot: the device whose history to read.
    pub device: usize,
}

pub fn write_header(out: &mut dyn Write, h: &Header, version: u16) -> std::io::Result<()> {
    writeln!(out, "# alloctrace trace, format version {version}")?;
    writeln!(out, "# source: {}", h.source.as_str())?;
    // Header strings come from the trace: one line each, whatever they hold.
    let t = |s: &str| crate::model::escape::terminal(s).into_owned();
    writeln!(out, "# tool_version: {}", t(&h.tool_version))?;
    writeln!(
        out,
        "# device: {} ({} bytes)",
        if h.device_name.is_empty() { "unknown".into() } else { t(&h.device_name) },
        h.device_total_bytes
    )?;
    writeln!(out, "# alloc_conf: {}", t(&h.alloc_conf))?;
    writeln!(out, "# capacity_bytes: {}", h.capacity_bytes)?;
    writeln!(out, "# clock_origin_unix_ns: {}", h.clock_origin_unix_ns)?;
    if h.pid != 0 {
        writeln!(out, "# pid: {}", h.pid)?;
    }
    if !h.command_line.is_empty() {
        writeln!(out, "# command_line: {}", t(&h.command_line.join(" ")))?;
    }
    for n in &h.notes {
        writeln!(out, "# note: {}", t(n))?;
    }
    Ok(())
}

/// Formats one record as a dump line (without the newline).
pub fn format_record(index: u64, r: &Record, s: &mut String) {
    use std::fmt::Write as _;
    s.clear();
    let _ = write!(s, "{index} {} {}", r.time_ns, r.event.kind_name());
    let _ = match &r.event {
        Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite } => write!(
            s,
            " id={id} addr={addr:#x} requested={requested_bytes} block={block_bytes} stream={stream} pool={} callsite={callsite}",
            pool.as_str()
        ),
        Event::FreeRequested { id, addr, callsite } => write!(s, " id={id} addr={addr:#x} callsite={callsite}"),
        Event::FreeCompleted { id, addr } => write!(s, " id={id} addr={addr:#x}"),
        Event::SegmentAlloc { addr, bytes, stream, pool }
        | Event::SegmentFree { addr, bytes, stream, pool }
        | Event::SegmentMap { addr, bytes, stream, pool }
        | Event::SegmentUnmap { addr, bytes, stream, pool } => {
            write!(s, " addr={addr:#x} bytes={bytes} stream={stream} pool={}", pool.as_str())
        }
        Event::Split { addr, bytes, remainder_bytes } => {
            write!(s, " addr={addr:#x} bytes={bytes} remainder={remainder_bytes}")
        }
        Event::Merge { addr, absorbed_addr, bytes } => {
            write!(s, " addr={addr:#x} absorbed={absorbed_addr:#x} bytes={bytes}")
        }
        Event::CacheRelease { cause, bytes, segments } => {
            write!(s, " cause={} bytes={bytes} segments={segments}", cause.as_str())
        }
        Event::Oom {
            requested_bytes,
            alloc_bytes,
            device_free_bytes,
            reserved_bytes,
            allocated_bytes,
            limit_bytes,
            stream,
        } => write!(
            s,
            " requested={requested_bytes} alloc={alloc_bytes} device_free={device_free_bytes} reserved={reserved_bytes} allocated={allocated_bytes} limit={limit_bytes} stream={stream}"
        ),
        Event::Mark { kind, text } => write!(s, " kind={} text={text:?}", kind.as_str()),
        Event::CallSite { id, frames } => {
            let _ = write!(s, " id={id} frames=");
            for (i, f) in frames.iter().enumerate() {
                let (file, function) = (crate::model::escape::terminal(&f.file), crate::model::escape::terminal(&f.function));
                let _ = write!(s, "{}{file}:{}:{function}", if i > 0 { ";" } else { "" }, f.line);
            }
            Ok(())
        }
        Event::Snapshot { active_bytes } => write!(s, " active={active_bytes}"),
        Event::DeviceMemInfo { free_bytes, total_bytes } => write!(s, " free={free_bytes} total={total_bytes}"),
        Event::Dropped { events } => write!(s, " events={events}"),
        Event::SegmentPool { addr, pool_id } => write!(s, " addr={addr:#x} pool_id={},{}", pool_id[0], pool_id[1]),
    };
}

pub fn run(opts: &DumpOptions, out: &mut dyn Write) -> Result<i32> {
    if crate::source::input::is_pickle(&opts.trace) {
        return run_snapshot(opts, out);
    }
    crate::source::input::trace_has_one_device(&opts.trace, opts.device)?;
    let reader = tracefile::open(&opts.trace)?;
    write_header(out, reader.header(), reader.version())?;
    drop(reader);
    let scanned = write_records(out, |fold| tracefile::scan(&opts.trace, fold))?;
    writeln!(out, "# end: {} ({} events)", scanned.end.describe(), scanned.events)?;
    if let Some(w) = scanned.damage_warning() {
        crate::model::escape::warn(&w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}

/// `dump` of a PyTorch snapshot: the events alloctrace imports from it (as `alloctrace import
/// torch` would write them), after a header saying so.
fn run_snapshot(opts: &DumpOptions, out: &mut dyn Write) -> Result<i32> {
    let trace = super::open_any(&opts.trace, None, opts.device)?;
    writeln!(out, "# imported from a PyTorch memory snapshot (as `alloctrace import torch` writes it)")?;
    write_header(out, &trace.header, recorder::trace::FORMAT_VERSION)?;
    let scanned = write_records(out, |fold| trace.scan(fold))?;
    writeln!(out, "# end: {} events imported", scanned.events)?;
    Ok(exit::OK)
}

/// Writes one line per record that `scan` hands its fold, stopping at the first write error.
fn write_records(
    out: &mut dyn Write,
    scan: impl FnOnce(&mut dyn FnMut(u64, &recorder::trace::Record)) -> Result<tracefile::Scanned>,
) -> Result<tracefile::Scanned> {
    let mut line = String::with_capacity(256);
    let mut io_err: Option<std::io::Error> = None;
    let scanned = scan(&mut |i, r| {
        if io_err.is_some() {
            return;
        }
        format_record(i, r, &mut line);
        if let Err(e) = writeln!(out, "{line}") {
            io_err = Some(e);
        }
    })?;
    match io_err {
        Some(e) => Err(e.into()),
        None => Ok(scanned),
    }
}
