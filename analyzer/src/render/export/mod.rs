//! Exports of a trace to the viewers people already use: PyTorch's memory_viz (a snapshot
//! pickle) and Perfetto / chrome://tracing (Chrome trace-event JSON). Each exporter takes a
//! trace and a writer; `alloctrace export` (`crate::cmd::export`) puts the output in a file,
//! within its bound.

pub mod memory_viz;
pub mod perfetto;
pub mod pickle;
