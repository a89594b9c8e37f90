//! The one name of a CUDA stream in every output (text, pictures, Markdown, exports):
//! `stream 0 (default)` for the legacy default stream (handle 0), then `stream 1`, `stream 2`,
//! ... for the others in the order the trace first uses them. The raw handle (a pointer value,
//! such as 1167922496) means nothing to a reader and differs from run to run: it is given once,
//! in a note beside the names ([`StreamNames::handles_note`]).

use recorder::trace::Event;

/// The name of the stream numbered `n` (0 is the default stream).
pub fn stream_name(n: usize) -> String {
    if n == 0 {
        "stream 0 (default)".to_string()
    } else {
        format!("stream {n}")
    }
}

/// The streams of a trace, numbered in the order of their first use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamNames {
    /// Handles other than 0, in the order of first use: `stream k` is `side[k - 1]`.
    side: Vec<u64>,
    /// The number of each handle in `side` (a trace may name a new stream at every event).
    index: rustc_hash::FxHashMap<u64, usize>,
}

impl StreamNames {
    /// Numbers `handle` if it is new; its number.
    pub fn observe(&mut self, handle: u64) -> usize {
        if handle == 0 {
            return 0;
        }
        match self.index.get(&handle) {
            Some(&n) => n,
            None => {
                self.side.push(handle);
                self.index.insert(handle, self.side.len());
                self.side.len()
            }
        }
    }

    /// The number of `handle`, if the trace uses it.
    pub fn number(&self, handle: u64) -> Option<usize> {
        if handle == 0 {
            return Some(0);
        }
        self.index.get(&handle).copied()
    }

    /// The name of `handle`: `stream N`; a handle the trace never used keeps its raw value.
    pub fn name(&self, handle: u64) -> String {
        match self.number(handle) {
            Some(n) => stream_name(n),
            None => format!("stream handle {handle:#x}"),
        }
    }

    /// The raw handles behind the names, for a note: `None` when only the default stream is used.
    pub fn handles_note(&self) -> Option<String> {
        if self.side.is_empty() {
            return None;
        }
        // The first few: a trace may name thousands of streams.
        const SHOWN: usize = 16;
        let mut each: Vec<String> = (self.side.iter().enumerate().take(SHOWN))
            .map(|(k, h)| format!("{} = handle {h:#x}", stream_name(k + 1)))
            .collect();
        if self.side.len() > SHOWN {
            each.push(format!("and {} more", self.side.len() - SHOWN));
        }
        Some(format!("streams are numbered in the order the trace first uses them: {}", each.join(", ")))
    }
}

/// The stream an event names, if any.
pub fn stream_of(e: &Event) -> Option<u64> {
    match e {
        Event::Alloc { stream, .. }
        | Event::SegmentAlloc { stream, .. }
        | Event::SegmentFree { stream, .. }
        | Event::SegmentMap { stream, .. }
        | Event::SegmentUnmap { stream, .. }
        | Event::Oom { stream, .. } => Some(*stream),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_first_then_side_streams_in_order_of_first_use() {
        let mut n = StreamNames::default();
        assert_eq!(n.observe(0x4593_0040), 1);
        assert_eq!(n.observe(0), 0);
        assert_eq!(n.observe(0x1000), 2);
        assert_eq!(n.observe(0x4593_0040), 1);
        assert_eq!(n.name(0), "stream 0 (default)");
        assert_eq!(n.name(0x4593_0040), "stream 1");
        assert_eq!(n.name(0x1000), "stream 2");
        assert_eq!(n.name(7), "stream handle 0x7");
        assert_eq!(
            n.handles_note().unwrap(),
            "streams are numbered in the order the trace first uses them: stream 1 = handle 0x45930040, stream 2 = \
             handle 0x1000"
        );
        assert_eq!(StreamNames::default().handles_note(), None);
    }
}
