//! A model fed by the engine's events: the block partition they describe, checked as it goes.
#![allow(dead_code)]

use recorder::engine::SegmentView;
use recorder::trace::Event;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum St {
    Free,
    Allocated,
    Pending,
}

/// Every mapped block by address: (bytes, state).
#[derive(Default, Debug)]
pub struct EventModel {
    pub blocks: BTreeMap<u64, (u64, St)>,
    /// cudaMalloc segments: addr -> bytes.
    pub segments: BTreeMap<u64, u64>,
}

impl EventModel {
    fn get(&self, addr: u64) -> (u64, St) {
        *self.blocks.get(&addr).unwrap_or_else(|| panic!("no block at {addr:#x}"))
    }

    pub fn apply(&mut self, e: &Event) {
        match *e {
            Event::SegmentAlloc { addr, bytes, .. } => {
                assert!(self.segments.insert(addr, bytes).is_none());
                assert!(self.blocks.insert(addr, (bytes, St::Free)).is_none());
            }
            Event::SegmentFree { addr, bytes, .. } => {
                assert_eq!(self.segments.remove(&addr), Some(bytes));
                assert_eq!(self.blocks.remove(&addr), Some((bytes, St::Free)), "segment freed with live blocks");
            }
            Event::SegmentMap { addr, bytes, .. } => {
                assert!(self.blocks.insert(addr, (bytes, St::Free)).is_none());
            }
            Event::SegmentUnmap { addr, bytes, .. } => {
                let (&start, &(size, st)) = self.blocks.range(..=addr).next_back().expect("unmap outside blocks");
                assert_eq!(st, St::Free, "unmap of a used block");
                assert!(start + size >= addr + bytes, "unmap beyond its block");
                self.blocks.remove(&start);
                if start < addr {
                    self.blocks.insert(start, (addr - start, St::Free));
                }
                if start + size > addr + bytes {
                    self.blocks.insert(addr + bytes, (start + size - addr - bytes, St::Free));
                }
            }
            Event::Split { addr, bytes, remainder_bytes } => {
                assert_eq!(self.get(addr), (bytes + remainder_bytes, St::Free), "split of {addr:#x}");
                self.blocks.insert(addr, (bytes, St::Free));
                self.blocks.insert(addr + bytes, (remainder_bytes, St::Free));
            }
            Event::Merge { addr, absorbed_addr, bytes } => {
                let (a, sa) = self.get(addr);
                let (b, sb) = self.get(absorbed_addr);
                assert_eq!((sa, sb), (St::Free, St::Free), "merge of used blocks");
                assert_eq!(addr + a, absorbed_addr, "merge of non-adjacent blocks");
                assert_eq!(a + b, bytes);
                self.blocks.remove(&absorbed_addr);
                self.blocks.insert(addr, (bytes, St::Free));
            }
            Event::Alloc { addr, block_bytes, requested_bytes, .. } => {
                assert_eq!(self.get(addr), (block_bytes, St::Free), "alloc at {addr:#x}");
                assert!(block_bytes >= requested_bytes);
                self.blocks.insert(addr, (block_bytes, St::Allocated));
            }
            Event::FreeRequested { addr, .. } => {
                let (b, st) = self.get(addr);
                assert_eq!(st, St::Allocated);
                self.blocks.insert(addr, (b, St::Pending));
            }
            Event::FreeCompleted { addr, .. } => {
                let (b, st) = self.get(addr);
                assert_eq!(st, St::Pending);
                self.blocks.insert(addr, (b, St::Free));
            }
            Event::CacheRelease { .. }
            | Event::Oom { .. }
            | Event::Mark { .. }
            | Event::CallSite { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. }
            | Event::SegmentPool { .. } => {}
        }
    }

    /// The model's blocks must be exactly the engine's.
    pub fn check_against(&self, segments: &[SegmentView]) {
        let engine: BTreeMap<u64, (u64, St)> = segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .map(|b| {
                let st = if b.allocated {
                    St::Allocated
                } else if b.pending_free {
                    St::Pending
                } else {
                    St::Free
                };
                (b.addr, (b.bytes, st))
            })
            .collect();
        assert_eq!(engine, self.blocks, "event model and engine layout differ");
    }
}
