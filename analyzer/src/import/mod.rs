//! Foreign formats turned into alloctrace traces.
//!
//! * [`pickle`]: a pure-Rust, non-executing reader of Python pickles (protocols 2 to 5).

pub mod pickle;
