//! alloctrace's recorder crate: the caching allocator engine (PyTorch's policy, pure), the
//! trace format, the devices that back the engine (simulated and CUDA), and the recorder that
//! runs the engine on a real GPU and writes every decision to a trace.
//!
//! The engine has no I/O and no CUDA, so the recorder and the analyzer's what-if replays run
//! the same code and can never disagree.

pub mod device;
pub mod engine;
pub mod ffi;
pub mod recorder;
pub mod trace;
