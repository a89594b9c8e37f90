//! A specialised encoder of records, writing exactly the bytes bincode 2 (standard
//! configuration) writes, for the writer's hot path (a live recorder encodes every event).
//! Checked against bincode by property tests (`fast_encoder_agrees_with_bincode`).

use super::event::{Event, MarkKind, Pool, Record, ReleaseCause};

#[inline(always)]
pub(super) fn u64v(out: &mut Vec<u8>, v: u64) {
    if v < 251 {
        out.push(v as u8);
    } else if v < 1 << 16 {
        out.push(251);
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if v < 1 << 32 {
        out.push(252);
        out.extend_from_slice(&(v as u32).to_le_bytes());
    } else {
        out.push(253);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[inline(always)]
fn u32v(out: &mut Vec<u8>, v: u32) {
    u64v(out, v as u64)
}

fn string(out: &mut Vec<u8>, s: &str) {
    u64v(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn pool(out: &mut Vec<u8>, p: Pool) {
    u32v(out, p as u32);
}

/// Appends `r` to `out` as bincode would.
pub(crate) fn record(out: &mut Vec<u8>, r: &Record) {
    u64v(out, r.time_ns);
    u32v(out, r.event.kind_index() as u32);
    match &r.event {
        Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool: p, callsite } => {
            for v in [*id, *addr, *requested_bytes, *block_bytes, *stream] {
                u64v(out, v);
            }
            pool(out, *p);
            u32v(out, *callsite);
        }
        Event::FreeRequested { id, addr, callsite } => {
            u64v(out, *id);
            u64v(out, *addr);
            u32v(out, *callsite);
        }
        Event::FreeCompleted { id, addr } => {
            u64v(out, *id);
            u64v(out, *addr);
        }
        Event::SegmentAlloc { addr, bytes, stream, pool: p }
        | Event::SegmentFree { addr, bytes, stream, pool: p }
        | Event::SegmentMap { addr, bytes, stream, pool: p }
        | Event::SegmentUnmap { addr, bytes, stream, pool: p } => {
            for v in [*addr, *bytes, *stream] {
                u64v(out, v);
            }
            pool(out, *p);
        }
        Event::Split { addr, bytes, remainder_bytes } => {
            for v in [*addr, *bytes, *remainder_bytes] {
                u64v(out, v);
            }
        }
        Event::Merge { addr, absorbed_addr, bytes } => {
            for v in [*addr, *absorbed_addr, *bytes] {
                u64v(out, v);
            }
        }
        Event::CacheRelease { cause, bytes, segments } => {
            u32v(
                out,
                match cause {
                    ReleaseCause::EmptyCache => 0,
                    ReleaseCause::OomRetry => 1,
                    ReleaseCause::GarbageCollection => 2,
                    ReleaseCause::Oversize => 3,
                },
            );
            u64v(out, *bytes);
            u32v(out, *segments);
        }
        Event::Oom {
            requested_bytes,
            alloc_bytes,
            device_free_bytes,
            reserved_bytes,
            allocated_bytes,
            limit_bytes,
            stream,
        } => {
            for v in [
                *requested_bytes,
                *alloc_bytes,
                *device_free_bytes,
                *reserved_bytes,
                *allocated_bytes,
                *limit_bytes,
                *stream,
            ] {
                u64v(out, v);
            }
        }
        Event::Mark { kind, text } => {
            u32v(
                out,
                match kind {
                    MarkKind::Phase => 0,
                    MarkKind::Iteration => 1,
                    MarkKind::Annotation => 2,
                },
            );
            string(out, text);
        }
        Event::CallSite { id, frames } => {
            u32v(out, *id);
            u64v(out, frames.len() as u64);
            for f in frames {
                string(out, &f.file);
                u32v(out, f.line);
                string(out, &f.function);
            }
        }
        Event::Snapshot { active_bytes } => u64v(out, *active_bytes),
        Event::DeviceMemInfo { free_bytes, total_bytes } => {
            u64v(out, *free_bytes);
            u64v(out, *total_bytes);
        }
        Event::Dropped { events } => u64v(out, *events),
        Event::SegmentPool { addr, pool_id } => {
            u64v(out, *addr);
            u64v(out, pool_id[0]);
            u64v(out, pool_id[1]);
        }
    }
}
