//! What several commands share: the facts of a run (`--capacity`, `--conf`, `--device`,
//! `--torch-version`), the settings to replay under, `--json`, the parsers of sizes and settings,
//! and the one-line usage error.

use analyzer::model::units::parse_bytes;
use clap::Args;
use recorder::engine::config::{user_conf, AllocatorConfig};
use recorder::engine::version::TorchVersion;

/// `--json`: machine-readable output with stable keys (docs/json-schema.md).
#[derive(Args)]
pub struct Json {
    /// Machine-readable output with stable keys (its schema: docs/json-schema.md).
    #[arg(long)]
    pub json: bool,
}

/// `--iterations`: where a command predicts the whole job from a trace that stops at its failure.
#[derive(Args)]
pub struct Repeats {
    /// For a trace that ends in an out-of-memory error: iterations to append (repeating the last
    /// whole one before the failure) to predict whether the rest of the job fits.
    #[arg(long, default_value_t = analyzer::analysis::outcome::DEFAULT_REPEATS, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub iterations: u32,
}

/// `--capacity` wherever a command replays: one meaning, one text.
pub(super) const CAPACITY_HELP: &str =
    "The memory limit, as torch.cuda.set_per_process_memory_fraction sets it: bytes or \
6GiB, 1.5GB, 512MiB. Default: the trace's own (recorded, else inferred from its OOM, and said to be); snapshots do \
not store it";

/// `--torch-version` wherever a command replays.
pub(super) const TORCH_VERSION_HELP: &str =
    "The PyTorch release whose allocator to follow, e.g. 2.12 (default: the trace's, else 2.11)";

/// `--device` wherever a command reads a snapshot without replaying it under the user's facts.
#[derive(Args)]
pub struct Device {
    /// For a PyTorch snapshot (.pickle, imported on the fly): the device to analyse.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// What the user says about the run that a snapshot does not store.
#[derive(Args)]
pub struct RunArgs {
    #[arg(long, value_parser = parse_capacity, help = CAPACITY_HELP)]
    pub capacity: Option<u64>,
    /// The PYTORCH_CUDA_ALLOC_CONF the run used (snapshots do not store it).
    #[arg(long, value_parser = user_conf)]
    pub conf: Option<AllocatorConfig>,
    /// For a PyTorch snapshot (.pickle, imported on the fly): the device to analyse.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    #[arg(long, value_parser = parse_torch_version, help = TORCH_VERSION_HELP)]
    pub torch_version: Option<TorchVersion>,
}

impl RunArgs {
    pub fn facts(self) -> analyzer::source::input::RunFacts {
        analyzer::source::input::RunFacts {
            capacity_bytes: self.capacity,
            conf: self.conf,
            device: self.device,
            torch_version: self.torch_version,
            // Found when the input is opened (`cmd::open_input`).
            least_limit: None,
        }
    }
}

/// A release whose allocator the engine follows: 2.9 to 2.13 (`recorder::engine::version`).
pub fn parse_torch_version(s: &str) -> Result<TorchVersion, String> {
    let v = TorchVersion::parse(s)?;
    let (oldest, newest) = (TorchVersion::new(2, 9), TorchVersion::new(2, 13));
    if v < oldest || v > newest {
        return Err(format!(
            "PyTorch {v}: the engine follows the allocators of PyTorch {oldest} to {newest} (docs/commands.md, replay); give the nearest"
        ));
    }
    Ok(v)
}

/// Checks a configuration string but keeps it as written (it is handed to the recorder).
pub fn parse_conf_string(s: &str) -> Result<String, String> {
    user_conf(s).map(|_| s.to_string())
}

/// Checks a capacity but keeps it as written.
pub fn parse_capacity_string(s: &str) -> Result<String, String> {
    parse_capacity(s).map(|_| s.to_string())
}

/// A memory limit: a byte size above zero (no limit is the default, or `--unlimited`).
pub fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_bytes(s)? {
        0 => {
            Err("a limit of 0 bytes fits nothing; leave --capacity out for the trace's own limit (replay --unlimited \
                  replays with none)"
                .into())
        }
        b => Ok(b),
    }
}

/// One line from clap's usage error: its message with the lines that belong to it (the missing
/// arguments, the possible values, a suggestion), and which command's `--help` to read.
pub fn usage_error_line(text: &str, help: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("Usage: ") {
            break;
        } else if !t.is_empty() && !t.starts_with("For more information") {
            parts.push(t.trim_start_matches("error: ").trim_start_matches("tip: ").to_string());
        }
    }
    // "the following required arguments were not provided:" is followed by one argument a line.
    let mut line = String::new();
    let mut listing = false;
    for p in parts {
        if line.ends_with(':') {
            line.push(' ');
            listing = true;
        } else if p.starts_with('[') {
            line.push(' ');
        } else if listing && p.starts_with(['-', '<']) {
            line.push_str(", ");
        } else if !line.is_empty() {
            line.push_str("; ");
            listing = false;
        }
        line.push_str(&p);
    }
    if line.is_empty() {
        line.push_str("invalid arguments");
    }
    format!("{line} (see `{help} --help`)")
}

pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// `alloctrace --version`: the tool's version and the newest trace format it reads and writes.
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("{} (trace format {})", env!("CARGO_PKG_VERSION"), recorder::trace::FORMAT_VERSION)
});

/// Parses the command line; usage errors become one line on stderr and exit code 2.
pub fn parse<Cli: clap::Parser>() -> Cli {
    let parsed = Cli::command()
        .version(VERSION.as_str())
        .try_get_matches()
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    match parsed {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        Err(e) => {
            // The subcommand whose `--help` explains the mistake, when one was named.
            let named = std::env::args().skip(1).find(|a| !a.starts_with('-'));
            let help = match named {
                Some(sub) if Cli::command().find_subcommand(&sub).is_some() => format!("alloctrace {sub}"),
                _ => "alloctrace".to_string(),
            };
            eprintln!("alloctrace: error: {}", usage_error_line(&e.to_string(), &help));
            std::process::exit(analyzer::cmd::exit::ERROR)
        }
    }
}
