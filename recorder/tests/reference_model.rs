//! Property test: the engine against a naive allocator (vectors of blocks, linear best-fit
//! search) with the same policy, default configuration, several streams, optional capacity.

use proptest::prelude::*;
use recorder::device::{Device, SimDevice};
use recorder::engine::config::{AllocatorConfig, MIB};
use recorder::engine::{allocation_size, pool_for, round_size, Engine, NullSink};
use recorder::trace::Pool;

#[derive(Clone, Debug)]
struct NBlock {
    addr: u64,
    size: u64,
    allocated: bool,
}

#[derive(Clone, Debug)]
struct NSeg {
    pool: Pool,
    stream: u64,
    blocks: Vec<NBlock>,
}

/// The naive allocator.
struct Naive {
    cfg: AllocatorConfig,
    cap: Option<u64>,
    dev: SimDevice,
    segs: Vec<NSeg>,
    reserved: u64,
    allocated: u64,
}

impl Naive {
    fn malloc(&mut self, n: u64, stream: u64) -> Option<u64> {
        let s = round_size(&self.cfg, n);
        let pool = pool_for(s);
        // best fit: smallest sufficient free block on this stream and pool, then lowest address
        let mut best: Option<(u64, u64, usize, usize)> = None;
        for (si, seg) in self.segs.iter().enumerate() {
            if seg.pool != pool || seg.stream != stream {
                continue;
            }
            for (bi, b) in seg.blocks.iter().enumerate() {
                if !b.allocated && b.size >= s && best.is_none_or(|(sz, a, _, _)| (b.size, b.addr) < (sz, a)) {
                    best = Some((b.size, b.addr, si, bi));
                }
            }
        }
        let (si, bi) = match best {
            Some((_, _, si, bi)) => (si, bi),
            None => {
                let alloc = allocation_size(&self.cfg, s);
                let mut fits = self.cap.is_none_or(|c| self.reserved + alloc <= c);
                if !fits {
                    // release every whole free segment, then retry
                    let dev = &mut self.dev;
                    let reserved = &mut self.reserved;
                    self.segs.retain(|seg| {
                        let whole_free = seg.blocks.len() == 1 && !seg.blocks[0].allocated;
                        if whole_free {
                            dev.free_segment(seg.blocks[0].addr, seg.blocks[0].size);
                            *reserved -= seg.blocks[0].size;
                        }
                        !whole_free
                    });
                    fits = self.cap.is_none_or(|c| self.reserved + alloc <= c);
                }
                if !fits {
                    return None;
                }
                let addr = self.dev.alloc_segment(alloc, stream)?;
                self.reserved += alloc;
                self.segs.push(NSeg { pool, stream, blocks: vec![NBlock { addr, size: alloc, allocated: false }] });
                (self.segs.len() - 1, 0)
            }
        };
        let seg = &mut self.segs[si];
        let b = seg.blocks[bi].clone();
        let rem = b.size - s;
        let split = if pool == Pool::Small { rem >= 512 } else { rem > MIB };
        if split {
            seg.blocks[bi] = NBlock { addr: b.addr, size: s, allocated: true };
            seg.blocks.insert(bi + 1, NBlock { addr: b.addr + s, size: rem, allocated: false });
            self.allocated += s;
        } else {
            seg.blocks[bi].allocated = true;
            self.allocated += b.size;
        }
        Some(b.addr)
    }

    fn free(&mut self, addr: u64) {
        for seg in &mut self.segs {
            if let Some(i) = seg.blocks.iter().position(|b| b.addr == addr && b.allocated) {
                seg.blocks[i].allocated = false;
                self.allocated -= seg.blocks[i].size;
                if i + 1 < seg.blocks.len() && !seg.blocks[i + 1].allocated {
                    seg.blocks[i].size += seg.blocks.remove(i + 1).size;
                }
                if i > 0 && !seg.blocks[i - 1].allocated {
                    let b = seg.blocks.remove(i);
                    seg.blocks[i - 1].size += b.size;
                }
                return;
            }
        }
        panic!("naive: free of unknown {addr:#x}");
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64, u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1u64..=4096, 4096u64..=(1 << 20), (1u64 << 20)..(12 << 20), (12u64 << 20)..(80 << 20),];
    prop_oneof![
        3 => (size, 0u64..3).prop_map(|(s, st)| Op::Alloc(s, st)),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

fn check(ops: Vec<Op>, cap: Option<u64>) -> Result<(), TestCaseError> {
    let cfg = AllocatorConfig::default();
    let mut e = Engine::new(cfg.clone(), cap, SimDevice::new(None), NullSink);
    let mut n = Naive { cfg, cap, dev: SimDevice::new(None), segs: Vec::new(), reserved: 0, allocated: 0 };
    let mut live: Vec<u64> = Vec::new();
    for op in ops {
        match op {
            Op::Alloc(bytes, stream) => {
                let got = e.malloc(bytes, stream, 0).ok().map(|a| a.addr);
                let want = n.malloc(bytes, stream);
                prop_assert_eq!(got, want, "malloc({}, stream {})", bytes, stream);
                live.extend(got);
            }
            Op::Free(i) => {
                if live.is_empty() {
                    continue;
                }
                let addr = live.swap_remove(i % live.len());
                prop_assert!(e.free(addr).is_ok());
                n.free(addr);
            }
        }
        prop_assert_eq!(e.stats().allocated_bytes.all.current, n.allocated);
        prop_assert_eq!(e.stats().reserved_bytes.all.current, n.reserved);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_naive_allocator(ops in prop::collection::vec(op(), 1..300)) {
        check(ops, None)?;
    }

    #[test]
    fn engine_matches_naive_allocator_under_a_cap(ops in prop::collection::vec(op(), 1..300)) {
        check(ops, Some(300 * MIB))?;
    }
}
