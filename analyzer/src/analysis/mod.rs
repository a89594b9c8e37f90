//! What the analyzer finds in a trace: folds over its records, watches of a replay, and the
//! interpreters that turn them into verdicts and advice (`whatif`, `explain`, `frag`, `leaks`
//! and the rest), and the data the pictures and the report are drawn from. Nothing here opens or
//! writes a file, or draws.

pub mod advice;
pub mod capacity_search;
pub mod category;
pub mod diff;
pub mod explain;
pub mod frag;
pub mod leaks;
pub mod moment;
pub mod outcome;
pub mod patterns;
pub mod picture;
pub mod ranks;
pub mod report;
pub mod timeline;
pub mod whatif;
