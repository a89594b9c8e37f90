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
///
/// Encoded field by field in declaration order (bincode 2, standard configuration), then
/// [`Placement`] only when any of it is known or a PyTorch version follows, then
/// `torch_version` only when it is known: a header without them has exactly the bytes of the
/// first version, and a reader that stops after `notes` (or after the placement) ignores what
/// follows (the payload's length is in its frame).
#[derive(Serialize, Clone, Debug, PartialEq)]
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
    /// Which device and which rank of a distributed job the trace is of (appended field).
    pub placement: Placement,
    /// The PyTorch release the traced program ran (`torch.__version__`, e.g. "2.12.0+cu130");
    /// empty when unknown (appended field). A replay follows that release's allocator.
    pub torch_version: String,
}

/// Where in a job a trace was taken: the CUDA device, and for a distributed job (`torchrun`:
/// `RANK`, `LOCAL_RANK`, `WORLD_SIZE`) the process's rank. `None` = unknown.
#[derive(Encode, Decode, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub device_index: Option<u32>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
}

impl Placement {
    pub fn is_known(&self) -> bool {
        *self != Placement::default()
    }
}

impl Encode for Header {
    fn encode<E: bincode::enc::Encoder>(&self, e: &mut E) -> Result<(), bincode::error::EncodeError> {
        self.tool_version.encode(e)?;
        self.source.encode(e)?;
        self.device_name.encode(e)?;
        self.device_total_bytes.encode(e)?;
        self.alloc_conf.encode(e)?;
        self.config.encode(e)?;
        self.capacity_bytes.encode(e)?;
        self.clock_origin_unix_ns.encode(e)?;
        self.pid.encode(e)?;
        self.command_line.encode(e)?;
        self.notes.encode(e)?;
        if self.placement.is_known() || !self.torch_version.is_empty() {
            self.placement.encode(e)?;
        }
        if !self.torch_version.is_empty() {
            self.torch_version.encode(e)?;
        }
        Ok(())
    }
}

impl<C> Decode<C> for Header {
    fn decode<D: bincode::de::Decoder<Context = C>>(d: &mut D) -> Result<Self, bincode::error::DecodeError> {
        use bincode::de::read::Reader;
        let mut h = Header {
            tool_version: Decode::decode(d)?,
            source: Decode::decode(d)?,
            device_name: Decode::decode(d)?,
            device_total_bytes: Decode::decode(d)?,
            alloc_conf: Decode::decode(d)?,
            config: Decode::decode(d)?,
            capacity_bytes: Decode::decode(d)?,
            clock_origin_unix_ns: Decode::decode(d)?,
            pid: Decode::decode(d)?,
            command_line: Decode::decode(d)?,
            notes: Decode::decode(d)?,
            placement: Placement::default(),
            torch_version: String::new(),
        };
        // Headers written before the field, or with nothing known, end here.
        if d.reader().peek_read(1).is_some() {
            h.placement = Decode::decode(d)?;
        }
        // Headers written before the PyTorch version, or without one, end here.
        if d.reader().peek_read(1).is_some() {
            h.torch_version = Decode::decode(d)?;
        }
        Ok(h)
    }
}

bincode::impl_borrow_decode!(Header);

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
            placement: Placement::default(),
            torch_version: String::new(),
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
        for s in [&mut self.tool_version, &mut self.device_name, &mut self.alloc_conf, &mut self.torch_version] {
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

#[cfg(test)]
mod placement_tests {
    use super::*;
    use crate::trace::TraceReader;

    fn cfg() -> impl bincode::config::Config {
        bincode::config::standard()
    }

    /// The header as the first version wrote it, field for field.
    #[derive(Decode, Debug, PartialEq)]
    struct HeaderV1 {
        tool_version: String,
        source: Source,
        device_name: String,
        device_total_bytes: u64,
        alloc_conf: String,
        config: AllocatorConfig,
        capacity_bytes: u64,
        clock_origin_unix_ns: u64,
        pid: u32,
        command_line: Vec<String>,
        notes: Vec<String>,
    }

    fn header() -> Header {
        let mut h = Header::new(Source::Recorded);
        h.device_name = "GPU".into();
        h.pid = 7;
        h.notes = vec!["n".into()];
        h
    }

    /// A placement is appended after the first version's fields: 4 options (tag, then varint),
    /// and a header without one has exactly the first version's bytes.
    #[test]
    fn placement_is_appended_only_when_known() {
        let plain = bincode::encode_to_vec(header(), cfg()).unwrap();
        let mut h = header();
        h.placement = Placement { device_index: Some(1), rank: Some(3), local_rank: Some(1), world_size: Some(4) };
        let placed = bincode::encode_to_vec(&h, cfg()).unwrap();
        assert_eq!(&placed[..plain.len()], &plain[..]);
        assert_eq!(&placed[plain.len()..], &[1, 1, 1, 3, 1, 1, 1, 4]);
        let (back, n) = bincode::decode_from_slice::<Header, _>(&placed, cfg()).unwrap();
        assert_eq!((back, n), (h.clone(), placed.len()));
        let (back, _) = bincode::decode_from_slice::<Header, _>(&plain, cfg()).unwrap();
        assert_eq!(back.placement, Placement::default());
        // A reader of the first version reads the same fields and stops before the placement.
        let (v1, n) = bincode::decode_from_slice::<HeaderV1, _>(&placed, cfg()).unwrap();
        assert_eq!(n, plain.len());
        assert_eq!((v1.pid, v1.device_name.as_str(), v1.notes), (7, "GPU", vec!["n".to_string()]));
        let partial = Placement { device_index: Some(0), ..Default::default() };
        h.placement = partial;
        let bytes = bincode::encode_to_vec(&h, cfg()).unwrap();
        assert_eq!(&bytes[plain.len()..], &[1, 0, 0, 0, 0]);
        assert_eq!(bincode::decode_from_slice::<Header, _>(&bytes, cfg()).unwrap().0.placement, partial);
    }

    /// The PyTorch version is appended after the placement (which is then always written, even
    /// when unknown): headers without it keep their bytes, and a reader that knows only the
    /// placement reads the same fields and stops before it.
    #[test]
    fn torch_version_is_appended_after_the_placement_only_when_known() {
        let plain = bincode::encode_to_vec(header(), cfg()).unwrap();
        let mut h = header();
        h.torch_version = "2.12.0+cu130".into();
        let bytes = bincode::encode_to_vec(&h, cfg()).unwrap();
        assert_eq!(&bytes[..plain.len()], &plain[..]);
        // An unknown placement (four `None` tags), then the string (length, then bytes).
        assert_eq!(&bytes[plain.len()..plain.len() + 4], &[0, 0, 0, 0]);
        assert_eq!(bytes[plain.len() + 4] as usize, "2.12.0+cu130".len());
        let (back, n) = bincode::decode_from_slice::<Header, _>(&bytes, cfg()).unwrap();
        assert_eq!((back, n), (h.clone(), bytes.len()));
        // A header with a placement and no version keeps the placement-only bytes.
        let mut placed = header();
        placed.placement = Placement { device_index: Some(1), ..Default::default() };
        let placed_bytes = bincode::encode_to_vec(&placed, cfg()).unwrap();
        assert_eq!(bincode::decode_from_slice::<Header, _>(&placed_bytes, cfg()).unwrap().0.torch_version, "");
        placed.torch_version = "2.13".into();
        let both = bincode::encode_to_vec(&placed, cfg()).unwrap();
        assert_eq!(&both[..placed_bytes.len()], &placed_bytes[..]);
        assert_eq!(bincode::decode_from_slice::<Header, _>(&both, cfg()).unwrap().0, placed);
        // A reader of the first version reads the same fields and stops before the placement.
        let (v1, n) = bincode::decode_from_slice::<HeaderV1, _>(&bytes, cfg()).unwrap();
        assert_eq!((n, v1.pid), (plain.len(), 7));
    }

    /// The pinned trace of the first version (no placement) still reads, placement unknown.
    #[test]
    fn the_first_versions_golden_trace_reads_without_placement() {
        let hex = include_str!("golden_v1.hex").trim();
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let r = TraceReader::new(&bytes[..]).unwrap();
        assert_eq!(r.header().placement, Placement::default());
        assert_eq!(r.header().torch_version, "");
        assert_eq!(r.header().pid, 42);
    }
}
