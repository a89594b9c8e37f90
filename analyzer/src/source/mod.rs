//! Where traces come from: the reader of alloctrace's own files, the one opener every command
//! uses (it takes a `.pickle` snapshot too), the summary fold made as the file is read, the
//! importers of PyTorch's snapshots, and synthetic traces.

pub mod import;
pub mod input;
pub mod summary;
pub mod synth;
pub mod tracefile;
