//! Traces made up for the picture tests and the plot benchmark.
#![allow(dead_code)]

use recorder::trace::{Event, Frame, Header, Pool, Record, Source, TraceWriter};
use std::path::{Path, PathBuf};

/// A fresh directory under the system temp dir, unique per test and process.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-pictures-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub fn header() -> Header {
    let mut h = Header::new(Source::Recorded);
    h.device_name = "Test GPU".into();
    h.device_total_bytes = 80 << 30;
    h
}

/// Builds the records of a trace: allocations with call sites, frees in one call.
pub struct Builder {
    pub records: Vec<Record>,
    next_id: u64,
    next_addr: u64,
    time_ns: u64,
}

impl Default for Builder {
    fn default() -> Self {
        Builder { records: Vec::new(), next_id: 1, next_addr: 0x7f00_0000_0000, time_ns: 0 }
    }
}

impl Builder {
    fn push(&mut self, event: Event) {
        self.time_ns += 1000;
        self.records.push(Record { time_ns: self.time_ns, event });
    }
    pub fn callsite(&mut self, id: u32, file: &str, line: u32, function: &str) {
        self.push(Event::CallSite { id, frames: vec![Frame { file: file.into(), line, function: function.into() }] });
    }
    /// Returns (id, addr) of the new block.
    pub fn alloc(&mut self, bytes: u64, callsite: u32) -> (u64, u64) {
        let (id, addr) = (self.next_id, self.next_addr);
        self.next_id += 1;
        self.next_addr += bytes.div_ceil(512) * 512;
        self.push(Event::Alloc {
            id,
            addr,
            requested_bytes: bytes,
            block_bytes: 0,
            stream: 0,
            pool: if bytes <= 1 << 20 { Pool::Small } else { Pool::Large },
            callsite,
        });
        (id, addr)
    }
    pub fn free(&mut self, (id, addr): (u64, u64)) {
        self.push(Event::FreeRequested { id, addr, callsite: 0 });
        self.push(Event::FreeCompleted { id, addr });
    }
    pub fn write(&self, path: &Path) {
        let mut w = TraceWriter::create(path, &header()).expect("create trace");
        for r in &self.records {
            w.write(r).expect("write record");
        }
        w.finish().expect("finish trace");
    }
}

/// A random alloc/free trace of about `events` events (deterministic: a fixed-seed LCG), with
/// one short spike of `spike_bytes` in the middle. Returns the number of events written.
pub fn random_trace(path: &Path, events: u64, spike_bytes: u64) -> u64 {
    let mut w = TraceWriter::create(path, &header()).expect("create trace");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut rand = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut live: Vec<(u64, u64)> = Vec::new();
    let (mut id, mut addr, mut n, mut t) = (1u64, 0x7f00_0000_0000u64, 0u64, 0u64);
    let put = |w: &mut TraceWriter<_>, event: Event, n: &mut u64, t: &mut u64| {
        *t += 250;
        *n += 1;
        w.write(&Record { time_ns: *t, event }).expect("write record");
    };
    let spike_at = events / 2;
    while n < events {
        if n >= spike_at && n < spike_at + 3 {
            let a = (id, addr);
            id += 1;
            addr += spike_bytes;
            put(&mut w, alloc_event(a, spike_bytes), &mut n, &mut t);
            put(&mut w, Event::FreeRequested { id: a.0, addr: a.1, callsite: 0 }, &mut n, &mut t);
            put(&mut w, Event::FreeCompleted { id: a.0, addr: a.1 }, &mut n, &mut t);
            continue;
        }
        let r = rand();
        if live.len() < 64 || (live.len() < 4000 && r % 2 == 0) {
            // Sizes log-uniform from 512 B to 32 MiB.
            let bytes = 512u64 << (rand() % 17);
            let a = (id, addr);
            id += 1;
            addr += bytes;
            live.push(a);
            put(&mut w, alloc_event(a, bytes), &mut n, &mut t);
        } else {
            let k = (rand() as usize) % live.len();
            let a = live.swap_remove(k);
            put(&mut w, Event::FreeRequested { id: a.0, addr: a.1, callsite: 0 }, &mut n, &mut t);
            put(&mut w, Event::FreeCompleted { id: a.0, addr: a.1 }, &mut n, &mut t);
        }
    }
    w.finish().expect("finish trace");
    n
}

fn alloc_event((id, addr): (u64, u64), bytes: u64) -> Event {
    Event::Alloc {
        id,
        addr,
        requested_bytes: bytes,
        block_bytes: 0,
        stream: 0,
        pool: if bytes <= 1 << 20 { Pool::Small } else { Pool::Large },
        callsite: 0,
    }
}

/// Checks that `svg` is well-formed XML as far as tags go: every element closed in order, one
/// `<svg>` root. Returns the number of elements.
pub fn check_well_formed(svg: &str) -> usize {
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = svg;
    let mut elements = 0;
    let mut roots = 0;
    while let Some(start) = rest.find('<') {
        let after = &rest[start + 1..];
        let end = after.find('>').expect("unclosed tag");
        let tag = &after[..end];
        rest = &after[end + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "mismatched closing tag </{name}>");
            continue;
        }
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in <{tag}>");
        let name = tag.split_whitespace().next().expect("tag name").trim_end_matches('/');
        if stack.is_empty() {
            roots += 1;
            assert_eq!(name, "svg", "the root element is <svg>");
        }
        elements += 1;
        if !tag.ends_with('/') {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    assert_eq!(roots, 1, "one root element");
    elements
}

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

pub fn shipped(name: &str) -> PathBuf {
    workspace().join("traces").join(name)
}
