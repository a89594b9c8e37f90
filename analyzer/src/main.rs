//! `alloctrace`: find out what happened to GPU memory. Thin: parses arguments (each command's
//! in `cli/`), calls the library, maps errors to exit codes (2 = bad input, 3 = damaged trace
//! analyzed up to the damage, or an output past its bound; a broken pipe exits 0).

mod cli;

use analyzer::cmd::exit;
use clap::{Parser, Subcommand};
use std::io::Write;

#[derive(Parser)]
#[command(
    name = "alloctrace",
    // Help wraps to the terminal, at most 100 columns (100 where output is not a terminal).
    max_term_width = 100,
    about = "Record, replay and explain GPU caching-allocator memory traces",
    long_about = "alloctrace reads allocator traces (its own .atrace files and PyTorch memory snapshots), \
replays them through a faithful model of PyTorch's CUDA caching allocator, and answers \
\"why did I run out of memory, and what do I change?\".\n\n\
Reserved is not allocated: the caching allocator keeps freed blocks in segments it got from \
the device, so nvidia-smi shows memory that no tensor holds. A request can fail although \
gigabytes are \"free\", because those bytes sit in pieces inside partly used segments.",
    after_help = "Start here:\n  alloctrace explain traces/frag_oom.default.atrace      why did it run out of memory?\n  \
alloctrace summary traces/frag_oom.default.atrace      what happened, in one screen\n  \
alloctrace whatif traces/gpt2_train.default.atrace --capacity 5.5GiB   which settings fit?\n  \
alloctrace leaks traces/leak_list_append.default.atrace                what keeps growing?\n\n\
Exit codes: 0 success, 2 bad input or usage, 3 the trace is damaged (results cover what came before the damage)\n\
or an output would pass its bound (a report's file 16 MiB, an export 256 MiB; nothing is written)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Import(cli::import::Args),
    Dump(cli::dump::Args),
    Summary(cli::summary::Args),
    Replay(cli::replay::Args),
    Whatif(cli::whatif::Args),
    Synth(cli::synth::Args),
    Record(cli::record::Args),
    Plot(cli::plot::Args),
    Report(cli::report::Args),
    Diff(cli::diff::Args),
    Ranks(cli::ranks::Args),
    Frag(cli::frag::Args),
    Leaks(cli::leaks::Args),
    Export(cli::export::Args),
    Explain(cli::explain::Args),
}

fn dispatch(cli: Cli, out: &mut dyn Write) -> anyhow::Result<i32> {
    match cli.command {
        Command::Import(a) => a.run(out),
        Command::Dump(a) => a.run(out),
        Command::Summary(a) => a.run(out),
        Command::Replay(a) => a.run(out),
        Command::Whatif(a) => a.run(out),
        Command::Synth(a) => a.run(out),
        Command::Record(a) => a.run(out),
        Command::Plot(a) => a.run(out),
        Command::Report(a) => a.run(out),
        Command::Diff(a) => a.run(out),
        Command::Ranks(a) => a.run(out),
        Command::Frag(a) => a.run(out),
        Command::Leaks(a) => a.run(out),
        Command::Export(a) => a.run(out),
        Command::Explain(a) => a.run(out),
    }
}

fn main() {
    let cli: Cli = cli::args::parse();
    let stdout = std::io::stdout();
    // Strings from a trace reach the output: no control character gets to the terminal raw.
    let mut out =
        std::io::BufWriter::with_capacity(1 << 16, analyzer::model::escape::TerminalWriter::new(stdout.lock()));
    let code = match dispatch(cli, &mut out).and_then(|code| {
        out.flush()?;
        Ok(code)
    }) {
        Ok(code) => code,
        Err(e) if cli::args::is_broken_pipe(&e) => exit::OK,
        Err(e) => {
            let _ = out.flush();
            eprintln!("alloctrace: error: {}", analyzer::model::escape::terminal(&format!("{e:#}")));
            if analyzer::model::output::TooLarge::is_cause_of(&e) {
                exit::TOO_LARGE
            } else {
                exit::ERROR
            }
        }
    };
    std::process::exit(code);
}
