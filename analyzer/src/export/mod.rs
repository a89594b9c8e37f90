//! Exports of a trace to the viewers people already use: PyTorch's memory_viz (a snapshot
//! pickle) and Perfetto / chrome://tracing (Chrome trace-event JSON).

pub mod memory_viz;
pub mod perfetto;
pub mod pickle;
