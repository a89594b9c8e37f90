//! Foreign formats turned into alloctrace traces.
//!
//! * [`pickle`]: a pure-Rust, non-executing reader of Python pickles (protocols 2 to 5).
//! * [`torch`]: PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`) to trace records.

pub mod pickle;
pub mod torch;

pub use torch::{import_file, import_snapshot, ImportError, ImportOptions, ImportReport, Imported};
