//! A batch of events as the allocating thread leaves them for the writer: 64-bit words.
//!
//! Handing the writer [`Record`]s would cost the allocating thread an enum built on its stack
//! and copied into the buffer (72 bytes, read back with wider loads than the stores that wrote
//! it, which the processor cannot forward) for each of the five events of a split-and-merge
//! pair. Here the hot events are written field by field as words, and the time once per call:
//!
//! ```text
//! TIME  ticks                                  (at every call: its events share the time)
//! ALLOC | pool << 8 | callsite << 32, id, addr, requested_bytes, block_bytes, stream
//! FREE_REQUESTED | callsite << 32, id, addr
//! FREE_COMPLETED, id, addr
//! FREE_BOTH | callsite << 32, id, addr          (a free requested and completed at once)
//! SPLIT, addr, bytes, remainder_bytes
//! MERGE, addr, absorbed_addr, bytes
//! OTHER                                        (the next event of `others`, in order)
//! ```
//! The writer reads the words back ([`Batch::decode`]), converting the ticks, and writes the
//! hot events to the trace from their fields, with no [`Event`] built in between.

use crate::trace::{Event, HotEvent, Pool};

const TIME: u64 = 0;
const ALLOC: u64 = 1;
const FREE_REQUESTED: u64 = 2;
const FREE_COMPLETED: u64 = 3;
const SPLIT: u64 = 4;
const MERGE: u64 = 5;
const OTHER: u64 = 6;
/// A `FREE_REQUESTED` whose `FREE_COMPLETED` (same block) came next: the usual free, when no
/// other stream used the block. The completion rewrites the request's head instead of adding
/// three words.
const FREE_BOTH: u64 = 7;

pub(crate) struct Batch {
    words: Vec<u64>,
    others: Vec<Event>,
    events: usize,
    /// Where the last `FREE_REQUESTED` group starts, if it is the last group of the words.
    free_at: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Batch { words: Vec::new(), others: Vec::new(), events: 0, free_at: usize::MAX }
    }
}

impl Batch {
    pub fn with_capacity(events: usize) -> Batch {
        Batch { words: Vec::with_capacity(events * 5 + 64), others: Vec::new(), events: 0, free_at: usize::MAX }
    }

    /// Events in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    pub fn clear(&mut self) {
        self.words.clear();
        self.others.clear();
        self.events = 0;
        self.free_at = usize::MAX;
    }

    /// The time of the events that follow, in clock ticks.
    #[inline]
    pub fn time(&mut self, ticks: u64) {
        self.words.extend_from_slice(&[TIME, ticks]);
    }

    /// Inlined into the engine's calls so that the event's variant is known there and its
    /// fields go straight from registers into the words.
    #[inline(always)]
    pub fn push(&mut self, event: Event) {
        self.events += 1;
        // Not dropped here: the hot variants own nothing, and a drop of the whole enum would
        // be an out-of-line call that makes the event live on the stack after all.
        let event = std::mem::ManuallyDrop::new(event);
        match *event {
            Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite } => {
                let head = ALLOC | (pool as u64) << 8 | (callsite as u64) << 32;
                self.words.extend_from_slice(&[head, id, addr, requested_bytes, block_bytes, stream]);
            }
            Event::FreeRequested { id, addr, callsite } => {
                self.free_at = self.words.len();
                self.words.extend_from_slice(&[FREE_REQUESTED | (callsite as u64) << 32, id, addr]);
            }
            Event::FreeCompleted { id, addr } => {
                let n = self.words.len();
                if self.free_at.wrapping_add(3) == n && self.words[n - 2] == id {
                    self.words[n - 3] ^= FREE_REQUESTED ^ FREE_BOTH;
                } else {
                    self.words.extend_from_slice(&[FREE_COMPLETED, id, addr]);
                }
            }
            Event::Split { addr, bytes, remainder_bytes } => {
                self.words.extend_from_slice(&[SPLIT, addr, bytes, remainder_bytes]);
            }
            Event::Merge { addr, absorbed_addr, bytes } => {
                self.words.extend_from_slice(&[MERGE, addr, absorbed_addr, bytes]);
            }
            _ => self.push_other(std::mem::ManuallyDrop::into_inner(event)),
        }
    }

    #[cold]
    fn push_other(&mut self, event: Event) {
        self.words.push(OTHER);
        self.others.push(event);
    }

    /// The events, in order, with their times (`to_ns` applied to the ticks): the five hot
    /// kinds as [`HotEvent`]s, straight from the words, the others as they were pushed.
    pub fn decode(&mut self, mut to_ns: impl FnMut(u64) -> u64, mut f: impl FnMut(u64, Decoded)) {
        let mut others = self.others.drain(..);
        let (w, mut i, mut time_ns) = (&self.words, 0, 0);
        while i < w.len() {
            let head = w[i];
            let event = match head & 0xff {
                TIME => {
                    time_ns = to_ns(w[i + 1]);
                    i += 2;
                    continue;
                }
                ALLOC => {
                    let pool = if (head >> 8) & 0xff == Pool::Small as u64 { Pool::Small } else { Pool::Large };
                    let e = HotEvent::Alloc {
                        id: w[i + 1],
                        addr: w[i + 2],
                        requested_bytes: w[i + 3],
                        block_bytes: w[i + 4],
                        stream: w[i + 5],
                        pool,
                        callsite: (head >> 32) as u32,
                    };
                    i += 6;
                    Decoded::Hot(e)
                }
                FREE_REQUESTED => {
                    i += 3;
                    Decoded::Hot(HotEvent::FreeRequested {
                        id: w[i - 2],
                        addr: w[i - 1],
                        callsite: (head >> 32) as u32,
                    })
                }
                FREE_COMPLETED => {
                    i += 3;
                    Decoded::Hot(HotEvent::FreeCompleted { id: w[i - 2], addr: w[i - 1] })
                }
                FREE_BOTH => {
                    i += 3;
                    let (id, addr) = (w[i - 2], w[i - 1]);
                    f(time_ns, Decoded::Hot(HotEvent::FreeRequested { id, addr, callsite: (head >> 32) as u32 }));
                    Decoded::Hot(HotEvent::FreeCompleted { id, addr })
                }
                SPLIT => {
                    i += 4;
                    Decoded::Hot(HotEvent::Split { addr: w[i - 3], bytes: w[i - 2], remainder_bytes: w[i - 1] })
                }
                MERGE => {
                    i += 4;
                    Decoded::Hot(HotEvent::Merge { addr: w[i - 3], absorbed_addr: w[i - 2], bytes: w[i - 1] })
                }
                _ => {
                    i += 1;
                    match others.next() {
                        Some(e) => Decoded::Other(e),
                        None => break,
                    }
                }
            };
            f(time_ns, event);
        }
    }
}

/// An event out of a batch.
pub(crate) enum Decoded {
    Hot(HotEvent),
    Other(Event),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{MarkKind, Record, ReleaseCause};

    /// Every kind of event comes back as it went in, in order, at the time of its call.
    #[test]
    fn round_trip() {
        let events = vec![
            (
                10,
                Event::Alloc {
                    id: 1,
                    addr: 0x7f00,
                    requested_bytes: 1000,
                    block_bytes: 1024,
                    stream: 3,
                    pool: Pool::Small,
                    callsite: 7,
                },
            ),
            (10, Event::Split { addr: 0x7f00, bytes: 1024, remainder_bytes: 9 << 20 }),
            (
                20,
                Event::Alloc {
                    id: 2,
                    addr: u64::MAX - 511,
                    requested_bytes: u64::MAX,
                    block_bytes: 0,
                    stream: u64::MAX,
                    pool: Pool::Large,
                    callsite: u32::MAX,
                },
            ),
            (20, Event::Mark { kind: MarkKind::Phase, text: "forward".into() }),
            (30, Event::FreeRequested { id: 1, addr: 0x7f00, callsite: 5 }),
            (30, Event::FreeCompleted { id: 1, addr: 0x7f00 }),
            (30, Event::Merge { addr: 0x7f00, absorbed_addr: 0x8300, bytes: 2 << 20 }),
            // A free completed later (another stream used the block), then one completed at once.
            (35, Event::FreeRequested { id: 2, addr: u64::MAX - 511, callsite: 0 }),
            (
                35,
                Event::Alloc {
                    id: 3,
                    addr: 0x9000,
                    requested_bytes: 512,
                    block_bytes: 512,
                    stream: 0,
                    pool: Pool::Small,
                    callsite: 0,
                },
            ),
            (36, Event::FreeCompleted { id: 2, addr: u64::MAX - 511 }),
            (37, Event::FreeRequested { id: 3, addr: 0x9000, callsite: 0 }),
            (37, Event::FreeCompleted { id: 3, addr: 0x9000 }),
            (40, Event::CacheRelease { cause: ReleaseCause::EmptyCache, bytes: 2 << 20, segments: 1 }),
            (40, Event::Dropped { events: 4 }),
        ];
        let mut b = Batch::with_capacity(2);
        let mut last = None;
        for (t, e) in &events {
            if last != Some(*t) {
                b.time(*t);
                last = Some(*t);
            }
            b.push(e.clone());
        }
        assert_eq!(b.len(), events.len());
        let mut out = Vec::new();
        b.decode(
            |t| t * 100,
            |time_ns, e| {
                let event = match e {
                    Decoded::Hot(h) => h.into_event(),
                    Decoded::Other(e) => e,
                };
                out.push(Record { time_ns, event })
            },
        );
        let want: Vec<Record> = events.into_iter().map(|(t, event)| Record { time_ns: t * 100, event }).collect();
        assert_eq!(out, want);
        b.clear();
        assert!(b.is_empty());
    }
}
