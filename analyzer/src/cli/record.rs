//! `alloctrace record`: its arguments, handed to the library's command.

use super::args::{parse_capacity_string, parse_conf_string};
use analyzer::cmd;
use anyhow::Result;
use clap::{Args as ClapArgs, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

/// Run a program (e.g. a PyTorch script, unmodified) with the recording allocator and write its trace.
#[derive(ClapArgs)]
#[command(
    long_about = "Run a program with alloctrace's recording allocator installed before its first CUDA \
allocation, and write every allocator decision (allocations, frees, splits, merges, segments, \
cache releases, OOMs) to a trace as the program runs. For PyTorch scripts a small Python shim on \
PYTHONPATH installs the recorder when torch is imported; the script's output and exit code are \
unchanged. By default PyTorch's own caching allocator runs the job (CUDA graphs, record_stream and \
private pools behave exactly as natively) and its events are streamed into the trace by a small \
helper built against the installed torch at first use (cached); without a compiler, PyTorch's \
allocator history is converted at exit, at an OOM or on SIGTERM instead (a kill -9 loses it). \
`--allocator alloctrace` runs alloctrace's engine through torch.cuda.memory.CUDAPluggableAllocator \
(splits and merges recorded live; no CUDA graphs). Each process and device writes a trace of its \
own: under torchrun NAME.rank{R}.atrace, or a pattern with {rank}, {local_rank}, {device}, {pid}. torch.cuda.empty_cache() is recorded \
as a cache release. The trace survives a crash or kill -9 up to its last flush (at most about \
100 ms behind). A trace path that cannot be written, or an allocator setting that does not exist, are \
refused before the program starts (exit code 2); a disk that fills up during the run costs \
events (counted, and said in the closing line), never the run. Needs a GPU and the recorder \
library (build it with `cargo build --release -p alloctrace-recorder --features cuda`).\n\n\
Past the limit (PyTorch's allocator): a memory limit, --capacity or the job's own \
torch.cuda.set_per_process_memory_fraction, is recorded as the trace's capacity and not applied, \
so PyTorch serves past it and the trace holds the whole request stream: every analysis then \
answers at that limit for the whole job (which settings fit, what each needs). The job is \
stopped --after-limit whole iterations (iteration marks, else optimizer steps, else forwards) \
after the first point where it went past the limit (PyTorch's reserved memory plus the segment \
it asked for above the limit, the test PyTorch makes with a fraction), with one line on stderr \
saying so; `--after-limit end` runs it to its end. What this can change: a program that catches \
an out-of-memory error (a batch-size finder) or chooses by free memory (cuDNN's algorithm search, \
workspace sizes) sees plenty of memory and may ask for other things than it would under the \
limit. --capacity 80GiB also asks whether a job fits a device of 80 GiB, larger or smaller than \
this one (beyond this device's memory, the job still fails here).",
    after_help = "Examples:\n  alloctrace record -o run.atrace -- python train.py --epochs 1\n  \
alloctrace record -o run.atrace --conf expandable_segments:True --stacks -- python infer.py\n  \
alloctrace record -o oom.atrace --capacity 20GiB -- python train.py   (the whole job at 20 GiB)"
)]
pub struct Args {
    /// The trace to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax); default: PYTORCH_ALLOC_CONF and
    /// PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads them.
    #[arg(long, value_parser = parse_conf_string)]
    pub conf: Option<String>,
    /// The memory limit, e.g. 40GiB (PyTorch's memory fraction as a size). With PyTorch's
    /// allocator (default) it is recorded, not applied: the job runs past it (see below).
    /// With --allocator alloctrace the engine enforces it.
    #[arg(long, value_parser = parse_capacity_string)]
    pub capacity: Option<String>,
    /// Past the limit: stop the job N whole iterations after it first went past it, or `end`
    /// to let it run to its end.
    #[arg(long, value_name = "N|end", default_value = "3")]
    pub after_limit: cmd::record::AfterLimit,
    /// Record the Python call site of every allocation (costs time per allocation).
    #[arg(long)]
    pub stacks: bool,
    /// The recorder library; default: ALLOCTRACE_LIB, else next to this executable.
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// No summary line.
    #[arg(long, short)]
    pub quiet: bool,
    /// Which allocator runs the job: PyTorch's own (its events streamed into the trace), or
    /// alloctrace's engine (a policy for real, splits and merges recorded live).
    #[arg(long, value_enum, default_value = "pytorch")]
    pub allocator: RecordAllocator,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

impl Args {
    pub fn run(self, _out: &mut dyn Write) -> Result<i32> {
        cmd::record::run(&cmd::record::RecordOptions {
            output: self.output,
            conf: self.conf,
            capacity: self.capacity,
            after_limit: self.after_limit,
            stacks: self.stacks,
            lib: self.lib,
            command: self.command,
            quiet: self.quiet,
            allocator: match self.allocator {
                RecordAllocator::Pytorch => cmd::record::Allocator::Pytorch,
                RecordAllocator::Alloctrace => cmd::record::Allocator::Alloctrace,
            },
            convert_history: Some(cmd::record_history::convert_histories),
        })
    }
}

/// `record --allocator`.
#[derive(Clone, Copy, ValueEnum)]
pub enum RecordAllocator {
    /// PyTorch's own caching allocator (the job runs exactly as natively).
    Pytorch,
    /// alloctrace's engine through PyTorch's pluggable allocator.
    Alloctrace,
}
