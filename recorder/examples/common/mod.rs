//! A synthetic training-like workload shared by the examples: per iteration, activations are
//! allocated (mixed sizes, small to tens of MiB), some freed early, the rest at the end of the
//! iteration; parameters stay live; every 50 iterations `empty_cache`.

use recorder::device::Device;
use recorder::recorder::Recorder;
use recorder::trace::MarkKind;

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A request size: mostly small, some medium, a few large.
pub fn size(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=59 => 512 + rng.below(256 << 10),
        60..=89 => (1 << 20) + rng.below(9 << 20),
        _ => (10 << 20) + rng.below(54 << 20),
    }
}

/// Runs `iterations` iterations (or forever when `None`), calling `progress` after each.
pub fn run<D: Device + Send + 'static>(
    rec: &Recorder<D>,
    seed: u64,
    iterations: Option<u64>,
    stream: u64,
    mut progress: impl FnMut(u64),
) {
    let mut rng = Rng(seed | 1);
    let params: Vec<u64> = (0..32).filter_map(|_| rec.malloc(size(&mut rng), stream).ok().map(|a| a.addr)).collect();
    let fwd = rec.tag("forward");
    let bwd = rec.tag("backward");
    let mut it = 0u64;
    while iterations.is_none_or(|n| it < n) {
        rec.mark(MarkKind::Iteration, &format!("iteration {it}"));
        let mut live = Vec::new();
        {
            let _s = rec.scope(fwd);
            for _ in 0..64 {
                if let Ok(a) = rec.malloc(size(&mut rng), stream) {
                    live.push(a.addr);
                }
                if rng.below(3) == 0 && !live.is_empty() {
                    let i = rng.below(live.len() as u64) as usize;
                    let _ = rec.free(live.swap_remove(i));
                }
            }
        }
        {
            let _s = rec.scope(bwd);
            while let Some(a) = live.pop() {
                let _ = rec.free(a);
                if rng.below(4) == 0 {
                    if let Ok(b) = rec.malloc(size(&mut rng), stream) {
                        let _ = rec.free(b.addr);
                    }
                }
            }
        }
        if it % 50 == 49 {
            rec.empty_cache();
        }
        it += 1;
        progress(it);
    }
    for p in params {
        let _ = rec.free(p);
    }
}
