//! The command line: one file per command with its arguments (clap) and the call into the
//! library's command (`analyzer::cmd`), which never sees clap; `args` holds what several share.

pub mod args;
pub mod diff;
pub mod dump;
pub mod explain;
pub mod export;
pub mod frag;
pub mod import;
pub mod leaks;
pub mod plot;
pub mod ranks;
pub mod record;
pub mod replay;
pub mod report;
pub mod summary;
pub mod synth;
pub mod whatif;
