//! The trace header: where a trace came from, on which device, under which allocator settings.

use crate::engine::config::AllocatorConfig;
use bincode::{Decode, Encode};
use serde::Serialize;

/// Where the events of a trace came from.
#[derive(Encode, Decode, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Written by alloctrace's recorder while a program ran.
    #[serde(rename = "recorded")]
    Recorded,
    /// Converted from a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`).
    #[serde(rename = "imported-torch")]
    ImportedTorch,
    /// Written by a replay of another trace through the engine on a simulated device.
    #[serde(rename = "simulated")]
    Simulated,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Recorded => "recorded",
            Source::ImportedTorch => "imported-torch",
            Source::Simulated => "simulated",
        }
    }
}

/// Metadata at the start of every trace.
#[derive(Encode, Decode, Serialize, Clone, Debug, PartialEq)]
pub struct Header {
    /// Version of the alloctrace that wrote the trace.
    pub tool_version: String,
    pub source: Source,
    /// Device name, e.g. "NVIDIA H100 80GB HBM3"; empty when unknown.
    pub device_name: String,
    /// Total device memory in bytes; 0 when unknown.
    pub device_total_bytes: u64,
    /// The allocator settings as a `PYTORCH_CUDA_ALLOC_CONF` string, as the source gave it.
    pub alloc_conf: String,
    /// The same settings, parsed.
    pub config: AllocatorConfig,
    /// The capacity limit the allocator ran under (PyTorch's memory fraction); 0 = none.
    pub capacity_bytes: u64,
    /// Unix time of timestamp 0, in nanoseconds.
    pub clock_origin_unix_ns: u64,
    /// Process id of the traced program; 0 when unknown.
    pub pid: u32,
    /// Command line of the traced program; empty when unknown.
    pub command_line: Vec<String>,
    /// Free-text notes from the writer, e.g. that an imported ring buffer had overflowed.
    pub notes: Vec<String>,
}

impl Header {
    /// A header with the current tool version and nothing else known.
    pub fn new(source: Source) -> Self {
        Header {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            source,
            device_name: String::new(),
            device_total_bytes: 0,
            alloc_conf: String::new(),
            config: AllocatorConfig::default(),
            capacity_bytes: 0,
            clock_origin_unix_ns: 0,
            pid: 0,
            command_line: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// Most entries a writer keeps in a header list (`command_line`, `notes`); the last one kept
/// says how many more there were.
pub const MAX_HEADER_ITEMS: usize = 1024;

impl Header {
    /// Cuts every string to [`super::MAX_TEXT_BYTES`] and every list to [`MAX_HEADER_ITEMS`],
    /// as a writer stores them; returns whether anything was cut.
    pub fn bound(&mut self) -> bool {
        let mut cut = false;
        for s in [&mut self.tool_version, &mut self.device_name, &mut self.alloc_conf] {
            cut |= super::bound_text(s);
        }
        for list in [&mut self.command_line, &mut self.notes] {
            if list.len() > MAX_HEADER_ITEMS {
                let more = list.len() - (MAX_HEADER_ITEMS - 1);
                list.truncate(MAX_HEADER_ITEMS - 1);
                list.push(format!("...[truncated: {more} more]"));
                cut = true;
            }
            for s in list.iter_mut() {
                cut |= super::bound_text(s);
            }
        }
        cut
    }
}
