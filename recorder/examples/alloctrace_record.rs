//! `alloctrace record` as a standalone binary, running the same code as the CLI subcommand
//! (`analyzer/src/cmd/record.rs`), for machines where only the recorder crate is built.
//!
//! `alloctrace_record -o run.atrace [--conf CONF] [--capacity SIZE] [--after-limit N|end] [--allocator pytorch|alloctrace] [--stacks] [--lib PATH] -- PROGRAM ARGS...`

#[path = "../../analyzer/src/cmd/record.rs"]
mod record;

use std::path::PathBuf;

fn main() {
    let mut opts = record::RecordOptions { output: PathBuf::from("alloctrace.atrace"), ..Default::default() };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--" => break,
            "-o" | "--output" => opts.output = args.next().map(PathBuf::from).unwrap_or_default(),
            "--conf" => opts.conf = args.next(),
            "--capacity" => opts.capacity = args.next(),
            "--after-limit" => match args.next().map(|v| v.parse()) {
                Some(Ok(a)) => opts.after_limit = a,
                other => {
                    eprintln!("alloctrace_record: --after-limit takes a number or `end`: {other:?}");
                    std::process::exit(2);
                }
            },
            "--lib" => opts.lib = args.next().map(PathBuf::from),
            "--stacks" => opts.stacks = true,
            "--allocator" => match args.next().as_deref() {
                Some("pytorch") => opts.allocator = record::Allocator::Pytorch,
                Some("alloctrace") => opts.allocator = record::Allocator::Alloctrace,
                other => {
                    eprintln!("alloctrace_record: --allocator takes pytorch or alloctrace, not {other:?}");
                    std::process::exit(2);
                }
            },
            "-q" | "--quiet" => opts.quiet = true,
            other => {
                eprintln!("alloctrace_record: unknown option {other}");
                std::process::exit(2);
            }
        }
    }
    opts.command = args.collect();
    match record::run(&opts) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("alloctrace record: {e:#}");
            std::process::exit(2);
        }
    }
}
