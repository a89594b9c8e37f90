//! `synth`: deterministic, seeded synthetic traces that look like training jobs, of any size.
//!
//! A model with `layers` layers is trained for as many iterations as it takes to reach the
//! requested number of events. Each iteration:
//! 1. a data-loader stream allocates the input batch;
//! 2. forward: every layer allocates an activation (kept for backward) and short-lived
//!    temporaries of mixed sizes (small and large pools);
//! 3. backward, in reverse: each layer allocates a gradient scratch, frees its activation;
//! 4. optimizer step: temporaries per parameter group.
//!
//! On demand: `leak_bytes_per_iter` keeps a tensor per iteration from a "leaky" call site (a
//! loss appended to a list), and `fragment` interleaves long- and short-lived blocks of one
//! size so that freed holes cannot be given back. Requests go through the real engine (on a
//! simulated device), so the trace has every segment, split and merge event a recording has.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::Engine;
use recorder::trace::{Event, Frame, Header, MarkKind, Record, Source, TraceWriter};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub events: u64,
    pub seed: u64,
    pub output: PathBuf,
    pub config: AllocatorConfig,
    pub layers: u32,
    pub streams: u32,
    pub leak_bytes_per_iter: u64,
    pub fragment: bool,
    /// Shaped like a real trace instead of a training loop (see [`synth_realistic`]).
    pub realistic: bool,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            events: 1_000_000,
            seed: 1,
            output: PathBuf::from("synth.atrace"),
            config: AllocatorConfig::default(),
            layers: 24,
            streams: 2,
            leak_bytes_per_iter: 0,
            fragment: false,
            realistic: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SynthReport {
    pub events: u64,
    pub iterations: u64,
    /// Allocation requests (as `replay` counts them; frees are not requests).
    pub requests: u64,
    pub bytes: u64,
}

/// SplitMix64: tiny, fast, and the same numbers on every machine.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Call sites of the synthetic model: (id, file, line, function).
const SITES: &[(u32, &str, u32, &str)] = &[
    (1, "train.py", 41, "load_batch"),
    (2, "model.py", 88, "Block.forward"),
    (3, "model.py", 92, "Block.forward (temporary)"),
    (4, "model.py", 131, "Block.backward"),
    (5, "optim.py", 57, "AdamW.step"),
    (6, "train.py", 63, "train (losses.append)"),
    (7, "model.py", 20, "Model.__init__"),
    (8, "train.py", 70, "log_metrics"),
];

struct Gen {
    engine: Engine<SimDevice, Vec<Event>>,
    writer: TraceWriter<std::io::BufWriter<std::fs::File>>,
    time_ns: u64,
    events: u64,
    requests: u64,
    rng: Rng,
}

impl Gen {
    fn emit(&mut self, event: Event) -> Result<()> {
        self.writer.write(&Record { time_ns: self.time_ns, event })?;
        self.events += 1;
        Ok(())
    }

    fn flush_engine(&mut self) -> Result<()> {
        let evs = std::mem::take(self.engine.sink_mut());
        for e in evs.iter() {
            self.writer.write(&Record { time_ns: self.time_ns, event: e.clone() })?;
        }
        self.events += evs.len() as u64;
        let mut evs = evs;
        evs.clear();
        *self.engine.sink_mut() = evs;
        Ok(())
    }

    /// Allocates; returns the block's address. An OOM in the synthetic run is recorded as
    /// such and the block skipped.
    fn alloc(&mut self, bytes: u64, stream: u64, site: u32) -> Result<Option<u64>> {
        self.time_ns += 200 + self.rng.below(800);
        self.requests += 1;
        let r = self.engine.malloc(bytes, stream, site);
        self.flush_engine()?;
        match r {
            Ok(a) => Ok(Some(a.addr)),
            Err(_) => Ok(None),
        }
    }

    fn free(&mut self, addr: Option<u64>) -> Result<()> {
        if let Some(addr) = addr {
            self.time_ns += 100 + self.rng.below(400);
            // Stream-ordered: the free is requested, then completed once the stream's work is done.
            if self.engine.free_requested(addr).is_ok() {
                let _ = self.engine.free_completed(addr);
            }
            self.flush_engine()?;
        }
        Ok(())
    }

    /// A tensor size: mostly layer-shaped, sometimes small, sometimes large.
    fn size(&mut self, base: u64) -> u64 {
        match self.rng.below(10) {
            0..=2 => 512 + self.rng.below(64 << 10),
            3..=8 => base / 2 + self.rng.below(base),
            _ => base * 4 + self.rng.below(base * 4),
        }
    }
}

pub fn synth(opts: &SynthOptions) -> Result<SynthReport> {
    if opts.realistic {
        return synth_realistic(opts);
    }
    let mut h = Header::new(Source::Simulated);
    h.device_name = "synthetic".into();
    h.device_total_bytes = 80 << 30;
    h.alloc_conf = opts.config.to_string();
    h.config = opts.config.clone();
    h.command_line = vec![
        "alloctrace".into(),
        "synth".into(),
        format!("--events={}", opts.events),
        format!("--seed={}", opts.seed),
        format!("--layers={}", opts.layers),
        format!("--streams={}", opts.streams),
        format!("--leak-bytes-per-iter={}", opts.leak_bytes_per_iter),
        format!("--fragment={}", opts.fragment),
    ];
    h.notes.push("synthetic training-loop trace from alloctrace synth".into());
    let writer =
        TraceWriter::create(&opts.output, &h).with_context(|| format!("cannot write {}", opts.output.display()))?;
    let engine = Engine::new(opts.config.clone(), None, SimDevice::new(Some(80 << 30)), Vec::with_capacity(16));
    let mut g = Gen { engine, writer, time_ns: 0, events: 0, requests: 0, rng: Rng(opts.seed) };
    let bar = ProgressBar::new(opts.events);
    bar.set_style(
        ProgressStyle::with_template("synth [{bar:30}] {pos}/{len} events ({per_sec}, {eta})")
            .expect("static template")
            .progress_chars("=> "),
    );
    for &(id, file, line, function) in SITES {
        g.emit(Event::CallSite { id, frames: vec![Frame { file: file.into(), line, function: function.into() }] })?;
    }
    let streams: Vec<u64> = (0..opts.streams.max(1) as u64).map(|s| if s == 0 { 0 } else { 0x1000 + s }).collect();
    // Parameters: live for the whole run.
    let layer_bytes = |l: u32| -> u64 { (1 + (l as u64 % 4)) << 20 };
    for l in 0..opts.layers {
        let b = layer_bytes(l) * 4;
        g.alloc(b, 0, 7)?;
    }
    let mut kept_long: Vec<Option<u64>> = Vec::new();
    let mut iteration = 0u64;
    while g.events < opts.events {
        iteration += 1;
        g.emit(Event::Mark { kind: MarkKind::Iteration, text: format!("iteration {iteration}") })?;
        let loader = streams[(iteration as usize) % streams.len()];
        let batch = g.alloc(8 << 20, loader, 1)?;
        let mut acts = Vec::with_capacity(opts.layers as usize);
        for l in 0..opts.layers {
            let base = layer_bytes(l);
            let sz = g.size(base);
            acts.push(g.alloc(sz, 0, 2)?);
            for _ in 0..2 {
                let sz = g.size(base / 4);
                let t = g.alloc(sz, 0, 3)?;
                g.free(t)?;
            }
            if opts.fragment && l % 2 == 0 {
                // Long-lived and short-lived blocks of one size, interleaved: holes that
                // cannot be returned to the device.
                let keep = g.alloc(4 << 20, 0, 8)?;
                let tmp = g.alloc(4 << 20, 0, 3)?;
                kept_long.push(keep);
                g.free(tmp)?;
            }
        }
        if opts.leak_bytes_per_iter > 0 {
            // Alive forever: never freed, whatever `fragment` lets go of.
            g.alloc(opts.leak_bytes_per_iter, 0, 6)?;
        }
        g.free(batch)?;
        for l in (0..opts.layers).rev() {
            let sz = g.size(layer_bytes(l));
            let grad = g.alloc(sz, 0, 4)?;
            g.free(acts.pop().flatten())?;
            g.free(grad)?;
        }
        for _ in 0..(opts.layers / 4).max(1) {
            let sz = g.size(1 << 20);
            let t = g.alloc(sz, 0, 5)?;
            g.free(t)?;
        }
        if opts.fragment && kept_long.len() > 4 * opts.layers as usize {
            // Release the oldest long-lived blocks so the trace stays bounded in memory.
            let drop_n = kept_long.len() / 2;
            for a in kept_long.drain(..drop_n).collect::<Vec<_>>() {
                g.free(a)?;
            }
        }
        bar.set_position(g.events);
    }
    bar.finish_and_clear();
    let Gen { writer, events, requests, .. } = g;
    writer.finish().with_context(|| format!("cannot write {}", opts.output.display()))?;
    let bytes = std::fs::metadata(&opts.output).map(|m| m.len()).unwrap_or(0);
    Ok(SynthReport { events, iterations: iteration, requests, bytes })
}

/// Limit of a realistic trace: small enough to fill quickly, large enough for thousands of
/// segments.
pub const REALISTIC_CAPACITY: u64 = 24 << 30;

/// A trace shaped like the real ones, for sizes no real trace reaches: requests from bytes to
/// tens of MiB (log-uniform, so most are small and most bytes are in large ones) from 64 call
/// sites on 4 streams; lifetimes from a few requests (temporaries, most of them) to the whole
/// run; live bytes held near the limit ([`REALISTIC_CAPACITY`]) so that the allocator flushes
/// its cache and retries (thousands of segments come and go), then rising past it at the end:
/// the trace ends in an out-of-memory, where the program stops.
pub fn synth_realistic(opts: &SynthOptions) -> Result<SynthReport> {
    let capacity = REALISTIC_CAPACITY;
    let mut h = Header::new(Source::Simulated);
    h.device_name = "synthetic".into();
    h.device_total_bytes = 80 << 30;
    h.capacity_bytes = capacity;
    h.alloc_conf = opts.config.to_string();
    h.config = opts.config.clone();
    h.command_line = vec![
        "alloctrace".into(),
        "synth".into(),
        "--realistic".into(),
        format!("--events={}", opts.events),
        format!("--seed={}", opts.seed),
    ];
    h.notes.push("synthetic trace shaped like a real one, from alloctrace synth --realistic".into());
    let writer =
        TraceWriter::create(&opts.output, &h).with_context(|| format!("cannot write {}", opts.output.display()))?;
    let engine =
        Engine::new(opts.config.clone(), Some(capacity), SimDevice::new(Some(80 << 30)), Vec::with_capacity(16));
    let mut g = Gen { engine, writer, time_ns: 0, events: 0, requests: 0, rng: Rng(opts.seed) };
    let bar = ProgressBar::new(opts.events);
    bar.set_style(
        ProgressStyle::with_template("synth [{bar:30}] {pos}/{len} events ({per_sec}, {eta})")
            .expect("static template")
            .progress_chars("=> "),
    );
    for id in 1..=64u32 {
        let frames = vec![
            Frame { file: "torch/nn/modules/module.py".into(), line: 1750, function: "_call_impl".into() },
            Frame { file: format!("model_{}.py", id % 8), line: 10 + id * 7, function: format!("layer_{id}") },
        ];
        g.emit(Event::CallSite { id, frames })?;
    }
    let streams = [0u64, 0x1001, 0x1002, 0x1003];
    // Live blocks: (address, bytes); temporaries are the most recent ones.
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut live_bytes = 0u64;
    let mut iteration = 0u64;
    loop {
        if g.events % 50_000 < 3 {
            iteration += 1;
            g.emit(Event::Mark { kind: MarkKind::Phase, text: format!("step {iteration}") })?;
        }
        let progress = g.events as f64 / opts.events.max(1) as f64;
        // Live bytes aim at 85% of the limit, then past it over the last 2% of the trace.
        let target = if progress < 0.98 { 0.85 } else { 0.85 + (progress - 0.98) * 20.0 };
        let want = (target * capacity as f64) as u64;
        if live_bytes < want || live.is_empty() {
            // Log-uniform from 1 byte to 64 MiB.
            let bits = g.rng.below(26 * 16) as f64 / 16.0;
            let bytes = (2f64.powf(bits) as u64).max(1) + g.rng.below(512);
            let stream = streams[g.rng.below(4) as usize];
            let site = 1 + g.rng.below(64) as u32;
            match g.alloc(bytes, stream, site)? {
                Some(addr) => {
                    live.push((addr, bytes));
                    live_bytes += bytes;
                }
                // The program does not catch the error: the trace ends at its OOM.
                None if progress >= 0.98 => break,
                None => {}
            }
        } else {
            // Mostly a recent block (a temporary), sometimes an old one.
            let n = live.len() as u64;
            let k = if g.rng.below(8) == 0 { g.rng.below(n) } else { n - 1 - g.rng.below(n.min(32)) };
            let (addr, bytes) = live.swap_remove(k as usize);
            live_bytes -= bytes;
            g.free(Some(addr))?;
        }
        if g.events % 4096 < 3 {
            bar.set_position(g.events);
        }
        if g.events >= opts.events.saturating_mul(2) {
            break; // never reached the limit (a setting that packs well): stop anyway
        }
    }
    bar.finish_and_clear();
    let Gen { writer, events, requests, .. } = g;
    writer.finish().with_context(|| format!("cannot write {}", opts.output.display()))?;
    let bytes = std::fs::metadata(&opts.output).map(|m| m.len()).unwrap_or(0);
    Ok(SynthReport { events, iterations: iteration, requests, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(seed: u64, leak: u64, name: &str) -> (SynthReport, Vec<u8>) {
        gen_with(seed, leak, false, name)
    }

    fn gen_with(seed: u64, leak: u64, fragment: bool, name: &str) -> (SynthReport, Vec<u8>) {
        let out = std::env::temp_dir().join(format!("alloctrace-synth-{}-{name}", std::process::id()));
        let r = synth(&SynthOptions {
            events: 20_000,
            seed,
            output: out.clone(),
            leak_bytes_per_iter: leak,
            fragment,
            layers: 8,
            ..Default::default()
        })
        .unwrap();
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_file(out).ok();
        (r, bytes)
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let (a, ba) = gen(7, 0, "a");
        let (_, bb) = gen(7, 0, "b");
        let (_, bc) = gen(8, 0, "c");
        assert!(a.events >= 20_000);
        assert_eq!(ba, bb);
        assert_ne!(ba, bc);
    }

    /// With and without `fragment` (which lets go of its oldest long-lived blocks now and then:
    /// the leaked ones were among them), each iteration's leak stays live to the end.
    #[test]
    fn a_leak_makes_live_bytes_grow() {
        for fragment in [false, true] {
            let (r, leaky) = gen_with(3, 64 << 20, fragment, "leaky");
            let mut reader = recorder::trace::TraceReader::new(&leaky[..]).unwrap();
            let mut fold = crate::source::summary::SummaryFold::new();
            for (i, rec) in reader.by_ref().enumerate() {
                fold.record(i as u64, &rec);
            }
            let s = fold.finish();
            // One 64 MiB block per whole iteration, at least, is live at the end.
            assert!(r.iterations > 2);
            assert!(s.end_live_blocks >= r.iterations - 1, "fragment {fragment}: {} blocks", s.end_live_blocks);
            assert!(s.end_requested_bytes >= (r.iterations - 1) * (64 << 20), "fragment {fragment}");
        }
    }
}
