//! `alloctrace dump`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Print every event, one line each (stable, greppable).
#[derive(ClapArgs)]
#[command(after_help = "Columns: index, time in ns, kind, key=value fields. A PyTorch memory snapshot \
(.pickle) is dumped as the events alloctrace imports from it.\n\
Example:\n  alloctrace dump traces/seed_experiments.default.atrace | grep segment_")]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub device: super::args::Device,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::dump::run(&cmd::dump::DumpOptions { trace: self.trace, device: self.device.device }, out)
    }
}
