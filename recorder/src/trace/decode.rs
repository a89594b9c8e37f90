//! A specialised decoder for records as bincode 2 (standard configuration) encodes them.
//!
//! Reading is the hot path of every analysis (`summary` must take tens of millions of events a
//! second); bincode's generic decoder spends most of that budget on its reader abstraction and
//! limit bookkeeping. This decoder reads exactly the same bytes, field by field in declaration
//! order, and is checked against bincode by property tests (`fast_decoder_agrees_with_bincode`).
//!
//! bincode's varint: a first byte below 251 is the value; 251, 252 and 253 announce a u16, u32
//! or u64 that follows, little endian. Enum variants are a u32 varint, strings and vectors a
//! u64 varint length then the items.

use super::event::{Event, Frame, MarkKind, Pool, Record, ReleaseCause, MAX_CALLSITE_FRAMES, MAX_TEXT_BYTES};
use super::MAX_CHUNK_FRAMES;

pub(crate) struct Decoder<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
    /// Call-site frames decoded so far (a chunk holds at most [`MAX_CHUNK_FRAMES`]).
    frames: u64,
}

type R<T> = Result<T, String>;

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0, frames: 0 }
    }

    #[inline(always)]
    fn byte(&mut self) -> R<u8> {
        let b = *self.buf.get(self.pos).ok_or("unexpected end of chunk")?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or("unexpected end of chunk")?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    #[inline(always)]
    fn u64(&mut self) -> R<u64> {
        let b = self.byte()?;
        Ok(match b {
            0..=250 => b as u64,
            251 => u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as u64,
            252 => u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as u64,
            253 => u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")),
            _ => return Err(format!("invalid varint tag {b}")),
        })
    }

    #[inline(always)]
    fn u32(&mut self) -> R<u32> {
        let v = self.u64()?;
        u32::try_from(v).map_err(|_| format!("value {v} does not fit a u32"))
    }

    /// A text of at most [`MAX_TEXT_BYTES`], which a writer cuts longer ones to: `what` names
    /// the field.
    fn string(&mut self, what: &str) -> R<String> {
        let len = self.u64()?;
        if len > MAX_TEXT_BYTES as u64 {
            return Err(format!("{what} of {len} bytes; a writer cuts texts to {MAX_TEXT_BYTES}"));
        }
        let len = len as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("invalid UTF-8 in a string: {e}"))
    }

    fn pool(&mut self) -> R<Pool> {
        match self.u32()? {
            0 => Ok(Pool::Small),
            1 => Ok(Pool::Large),
            v => Err(format!("unknown pool {v}")),
        }
    }

    pub(crate) fn record(&mut self) -> R<Record> {
        let time_ns = self.u64()?;
        let variant = self.u32()?;
        let event = match variant {
            0 => Event::Alloc {
                id: self.u64()?,
                addr: self.u64()?,
                requested_bytes: self.u64()?,
                block_bytes: self.u64()?,
                stream: self.u64()?,
                pool: self.pool()?,
                callsite: self.u32()?,
            },
            1 => Event::FreeRequested { id: self.u64()?, addr: self.u64()?, callsite: self.u32()? },
            2 => Event::FreeCompleted { id: self.u64()?, addr: self.u64()? },
            3 => Event::SegmentAlloc { addr: self.u64()?, bytes: self.u64()?, stream: self.u64()?, pool: self.pool()? },
            4 => Event::SegmentFree { addr: self.u64()?, bytes: self.u64()?, stream: self.u64()?, pool: self.pool()? },
            5 => Event::SegmentMap { addr: self.u64()?, bytes: self.u64()?, stream: self.u64()?, pool: self.pool()? },
            6 => Event::SegmentUnmap { addr: self.u64()?, bytes: self.u64()?, stream: self.u64()?, pool: self.pool()? },
            7 => Event::Split { addr: self.u64()?, bytes: self.u64()?, remainder_bytes: self.u64()? },
            8 => Event::Merge { addr: self.u64()?, absorbed_addr: self.u64()?, bytes: self.u64()? },
            9 => Event::CacheRelease {
                cause: match self.u32()? {
                    0 => ReleaseCause::EmptyCache,
                    1 => ReleaseCause::OomRetry,
                    2 => ReleaseCause::GarbageCollection,
                    3 => ReleaseCause::Oversize,
                    v => return Err(format!("unknown release cause {v}")),
                },
                bytes: self.u64()?,
                segments: self.u32()?,
            },
            10 => Event::Oom {
                requested_bytes: self.u64()?,
                alloc_bytes: self.u64()?,
                device_free_bytes: self.u64()?,
                reserved_bytes: self.u64()?,
                allocated_bytes: self.u64()?,
                limit_bytes: self.u64()?,
                stream: self.u64()?,
            },
            11 => Event::Mark {
                kind: match self.u32()? {
                    0 => MarkKind::Phase,
                    1 => MarkKind::Iteration,
                    2 => MarkKind::Annotation,
                    v => return Err(format!("unknown mark kind {v}")),
                },
                text: self.string("mark text")?,
            },
            12 => {
                let id = self.u32()?;
                let n = self.u64()?;
                // Every frame takes at least three bytes: a hostile count cannot make us reserve.
                let remaining = (self.buf.len() - self.pos) as u64;
                if n > remaining / 3 {
                    return Err(format!("call site claims {n} frames in {remaining} bytes"));
                }
                if n > MAX_CALLSITE_FRAMES as u64 {
                    return Err(format!(
                        "call site {id} claims {n} frames; a writer keeps at most {MAX_CALLSITE_FRAMES}"
                    ));
                }
                self.frames += n;
                if self.frames > MAX_CHUNK_FRAMES {
                    return Err(format!(
                        "call sites of the chunk hold more than {MAX_CHUNK_FRAMES} frames, more than a writer puts in one"
                    ));
                }
                let mut frames = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let file = self.string("frame file")?;
                    frames.push(Frame { file, line: self.u32()?, function: self.string("frame function")? });
                }
                Event::CallSite { id, frames }
            }
            13 => Event::Snapshot { active_bytes: self.u64()? },
            14 => Event::DeviceMemInfo { free_bytes: self.u64()?, total_bytes: self.u64()? },
            15 => Event::Dropped { events: self.u64()? },
            16 => Event::SegmentPool { addr: self.u64()?, pool_id: [self.u64()?, self.u64()?] },
            v => return Err(format!("unknown event kind {v} (written by a newer alloctrace?)")),
        };
        Ok(Record { time_ns, event })
    }
}
