//! `alloctrace summary`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// What happened to GPU memory: events, peaks (and when), device calls, OOMs.
#[derive(ClapArgs)]
#[command(after_help = "Example:\n  alloctrace summary traces/gpt2_train.default.atrace --json")]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub run: super::args::RunArgs,
    #[command(flatten)]
    pub json: super::args::Json,
    /// Bytes by category (parameter, gradient, ...) also above 2,000,000 events (a second pass).
    #[arg(long)]
    pub categories: bool,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::summary::run(
            &cmd::summary::SummaryOptions {
                trace: self.trace,
                facts: self.run.facts(),
                json: self.json.json,
                categories: self.categories,
            },
            out,
        )
    }
}
