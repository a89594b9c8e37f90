//! `alloctrace`: find out what happened to GPU memory. Thin: parses arguments, calls the
//! library, maps errors to exit codes (2 = bad input, 3 = damaged trace analyzed up to the
//! damage, or an output past its bound; a broken pipe exits 0).

use analyzer::cmd::{self, exit};
use analyzer::units::parse_bytes;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use recorder::engine::config::{user_conf, AllocatorConfig};
use recorder::engine::version::TorchVersion;
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "alloctrace",
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
    /// Convert a foreign trace (a PyTorch memory snapshot) into an .atrace file.
    #[command(
        long_about = "Convert a PyTorch memory snapshot into an alloctrace trace.\n\n\
Make a snapshot in your script with\n  torch.cuda.memory._record_memory_history(max_entries=1_000_000)\n  ...\n  \
torch.cuda.memory._dump_snapshot(\"snap.pickle\")\n\
Every trace entry becomes an event; stack frames become call sites; empty_cache() calls are \
inferred from bursts of segment frees. If the snapshot's ring buffer dropped its oldest \
entries, the state before the first entry is reconstructed from its segments.",
        after_help = "Example:\n  alloctrace import torch snap.pickle -o snap.atrace --capacity 2GiB"
    )]
    Import {
        #[arg(value_enum)]
        format: ImportFormat,
        /// The snapshot file (a Python pickle; no Python is needed).
        snapshot: PathBuf,
        /// Where to write the trace.
        #[arg(short, long)]
        output: PathBuf,
        /// The memory limit the program ran under (snapshots don't record it), e.g. 2GiB.
        #[arg(long, value_parser = parse_capacity)]
        capacity: Option<u64>,
        /// Which device's trace to import.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Device name to record in the header, e.g. "NVIDIA H100 80GB HBM3".
        #[arg(long)]
        device_name: Option<String>,
        /// Total device memory to record in the header, e.g. 80GiB.
        #[arg(long, value_parser = parse_bytes)]
        device_memory: Option<u64>,
        /// The PyTorch release that wrote the snapshot, e.g. 2.12 (snapshots do not name it);
        /// replays follow its allocator.
        #[arg(long, value_parser = parse_torch_version)]
        torch_version: Option<TorchVersion>,
        #[arg(long)]
        json: bool,
    },
    /// Print every event, one line each (stable, greppable).
    #[command(after_help = "Columns: index, time in ns, kind, key=value fields.\n\
Example:\n  alloctrace dump traces/seed_experiments.default.atrace | grep segment_")]
    Dump { trace: PathBuf },
    /// What happened to GPU memory: events, peaks (and when), device calls, OOMs.
    #[command(after_help = "Example:\n  alloctrace summary traces/gpt2_train.default.atrace --json")]
    Summary {
        trace: PathBuf,
        /// Machine-readable output with stable keys.
        #[arg(long)]
        json: bool,
        /// Bytes by category (parameter, gradient, ...) also above 2,000,000 events (a second pass).
        #[arg(long)]
        categories: bool,
    },
    /// Replay a trace's requests through the allocator model under any settings and capacity.
    #[command(
        long_about = "Replay the trace's requests (alloc, free, empty_cache) through alloctrace's model of \
PyTorch's caching allocator on a simulated device, under the recorded settings or others, with \
or without a memory limit. Reports the outcome (ok, or the request that ran out of memory), \
the peaks of allocated, reserved and requested bytes, and the allocator's counters.",
        after_help = "Examples:\n  alloctrace replay traces/gpt2_train.default.atrace\n  \
alloctrace replay traces/gpt2_train.default.atrace --conf expandable_segments:True --capacity 5.5GiB\n  \
alloctrace replay traces/resnet50_train.default.atrace --conf max_split_size_mb:64 -o sim.atrace"
    )]
    Replay {
        trace: PathBuf,
        #[command(flatten)]
        policy: PolicyArgs,
        /// Write the simulated run as a full trace (segments, splits, merges) here.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Compare allocator policies on the same request stream, with the smallest capacity each needs.
    #[command(
        long_about = "Replay the trace under several allocator policies side by side (the recorded \
settings, expandable segments, max_split_size_mb, roundup_power2_divisions, a GC threshold when \
a capacity is given, and no caching at all), with the peak of live requested bytes (no allocator \
needs less) and, for reference, an offline plan that knows every lifetime in advance (greedy by \
size: a heuristic, which a policy can beat by a little). For each policy: \
peak reserved, fragmentation, device calls, the outcome at the capacity, and the smallest capacity \
at which the run completes.",
        after_help = "Example:\n  alloctrace whatif traces/gpt2_train.default.atrace --capacity 5.5GiB"
    )]
    Whatif {
        trace: PathBuf,
        /// Device capacity to test against (default: the trace's own limit, else unlimited).
        #[arg(long, value_parser = parse_capacity)]
        capacity: Option<u64>,
        /// The PYTORCH_CUDA_ALLOC_CONF the run used (snapshots do not store it).
        #[arg(long, value_parser = user_conf)]
        conf: Option<AllocatorConfig>,
        /// For a PyTorch snapshot (.pickle, imported on the fly): the device to analyse.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Ask the question of this PyTorch release's allocator, e.g. 2.12 (default: the trace's,
        /// else 2.11).
        #[arg(long, value_parser = parse_torch_version)]
        torch_version: Option<TorchVersion>,
        /// Skip the search for the smallest capacity of each policy (faster on huge traces).
        #[arg(long)]
        no_search: bool,
        /// For a trace that ends in an out-of-memory error: iterations to append (repeating the last
        /// whole one before the failure) to predict whether the rest of the job fits.
        #[arg(long, default_value_t = analyzer::outcome::DEFAULT_REPEATS, value_parser = clap::value_parser!(u32).range(1..=10000))]
        iterations: u32,
        #[arg(long)]
        json: bool,
    },
    /// Generate a deterministic synthetic training-loop trace of any size (for benchmarks and tests).
    #[command(
        long_about = "Generate a deterministic, seeded synthetic trace that looks like a training job: \
parameters, then iterations of forward activations and temporaries (small and large pools), \
backward in reverse, optimizer temporaries, a data-loader stream, iteration marks and call sites. \
On demand, a leak (a tensor kept per iteration) and fragmentation (interleaved long- and \
short-lived blocks). Requests go through the allocator model, so the trace holds every segment, \
split and merge event. The same seed gives the same bytes.",
        after_help = "Examples:\n  alloctrace synth --events 10000000 --seed 1 -o big.atrace\n  \
alloctrace synth --events 200000 --leak-bytes-per-iter 8MiB --fragment -o leaky.atrace"
    )]
    Synth {
        /// Number of events to generate (at least; an iteration is finished).
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(short, long)]
        output: PathBuf,
        /// Allocator settings of the synthetic run.
        #[arg(long, value_parser = user_conf)]
        conf: Option<AllocatorConfig>,
        /// Layers of the synthetic model.
        #[arg(long, default_value_t = 24)]
        layers: u32,
        /// Streams (the first is the compute stream; others load data).
        #[arg(long, default_value_t = 2)]
        streams: u32,
        /// Keep this many bytes per iteration alive forever (a leak), e.g. 8MiB.
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        leak_bytes_per_iter: u64,
        /// Interleave long- and short-lived blocks to fragment segments.
        #[arg(long)]
        fragment: bool,
        /// A trace shaped like a real one: sizes from bytes to tens of MiB, 4 streams, thousands
        /// of segments, cache flushes and retries near the limit, and a final out-of-memory.
        #[arg(long)]
        realistic: bool,
        #[arg(long)]
        json: bool,
    },
    /// Run a program (e.g. a PyTorch script, unmodified) with the recording allocator and write its trace.
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
    Record {
        /// The trace to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax); default: PYTORCH_ALLOC_CONF and
        /// PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads them.
        #[arg(long, value_parser = parse_conf_string)]
        conf: Option<String>,
        /// The memory limit, e.g. 40GiB (PyTorch's memory fraction as a size). With PyTorch's
        /// allocator (default) it is recorded, not applied: the job runs past it (see below).
        /// With --allocator alloctrace the engine enforces it.
        #[arg(long, value_parser = parse_capacity_string)]
        capacity: Option<String>,
        /// Past the limit: stop the job N whole iterations after it first went past it, or `end`
        /// to let it run to its end.
        #[arg(long, value_name = "N|end", default_value = "3")]
        after_limit: cmd::record::AfterLimit,
        /// Record the Python call site of every allocation (costs time per allocation).
        #[arg(long)]
        stacks: bool,
        /// The recorder library; default: ALLOCTRACE_LIB, else next to this executable.
        #[arg(long)]
        lib: Option<PathBuf>,
        /// No summary line.
        #[arg(long, short)]
        quiet: bool,
        /// Which allocator runs the job: PyTorch's own (its events streamed into the trace), or
        /// alloctrace's engine (a policy for real, splits and merges recorded live).
        #[arg(long, value_enum, default_value = "pytorch")]
        allocator: RecordAllocator,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Draw a picture of a trace as SVG: memory over time, the segment map, policies, fragmentation.
    #[command(
        long_about = "Draw one picture of the trace as a deterministic SVG (same trace, same bytes).\n\n\
timeline: allocated, reserved, active and requested bytes over time, replayed under the recorded \
settings, with the peak, OOMs, marks (phases, iterations, annotations) and the capacity limit. \
Reserved is what the device gave the allocator; allocated is what tensors hold; the gap between \
them is cached memory. With --stacked: live requested bytes by call site (the top 8, the rest as \
\"other\").\n\n\
segments: the segment map at a moment (--at peak, oom, end or an event index): one row per \
segment, allocated blocks in blue, free ones in grey, the largest free block in orange, and at \
an OOM the failed request in red to the same scale: \"out of memory although memory is free\" \
means no free block is as large as the red bar.\n\n\
whatif: reserved bytes over time under each policy of `alloctrace whatif`, against the live \
requested bytes (no allocator needs less).\n\n\
frag: two fragmentation measures over time: 1 - allocated / reserved (cached memory no tensor \
uses) and 1 - largest free block / total free (how broken up the free memory is).\n\n\
Long traces are folded into one column per pixel keeping each column's minimum and maximum, \
so the true peak always shows.",
        after_help = "Examples:\n  alloctrace plot traces/gpt2_train.default.atrace --kind timeline -o gpt2.svg\n  \
alloctrace plot traces/gpt2_train.default.atrace --kind timeline --stacked -o gpt2-sites.svg\n  \
alloctrace plot traces/frag_oom.default.atrace --kind segments --at oom -o oom.svg"
    )]
    Plot {
        trace: PathBuf,
        #[arg(long, value_enum, default_value = "timeline")]
        kind: PlotKind,
        /// Where to write the SVG.
        #[arg(short, long)]
        output: PathBuf,
        /// The moment of a segment map: peak (reserved), oom, end, or an event index.
        #[arg(long, default_value = "peak", value_parser = parse_plot_at)]
        at: analyzer::plot::At,
        /// Timeline: live bytes by call site, stacked.
        #[arg(long)]
        stacked: bool,
        /// What the x axis counts.
        #[arg(long, value_enum, default_value = "time")]
        x: PlotX,
        #[arg(long)]
        json: bool,
    },
    /// Write a report to paste into a ticket: report.md, report.html, summary.json, SVGs and PNGs.
    #[command(
        long_about = "Write a report of the trace into a directory: report.md (GitHub-flavoured Markdown to \
paste into an issue: the verdict and the fix first, the pictures as PNG files beside it, or inline \
with --inline-pictures), report.html (one self-contained page with the pictures inline; opens \
offline), summary.json (every figure, machine-readable), and each picture as SVG and PNG (drawn \
with an embedded font, so the same on every machine).\n\n\
The report states the environment (device, capacity limit, allocator settings, versions), the \
summary figures, findings with verdicts (out of memory, reserved-but-unallocated memory, free \
memory in pieces, memory needed beyond the live bytes, a leak or what is still live at the end), each \
defined in plain words; the diagnosis and advice of `explain`, the four fragmentation measures \
of `frag` and the leak analysis of `leaks`; the what-if table of other allocator settings; and \
the pictures of `plot`; where the trace has phases, what the memory is for (bytes by category \
at the peak and over time, and an estimate of activation checkpointing). Nothing in it depends on \
the clock or where the trace lies, so the same trace gives the same files.\n\n\
With several traces (one per rank of a distributed job), the report is of the rank that peaks, \
with a section across the ranks (`alloctrace ranks`) and its picture.",
        after_help = "Example:\n  alloctrace report traces/frag_oom.default.atrace -o report/\n  \
open report/report.html"
    )]
    Report {
        /// The trace, or one trace per rank.
        #[arg(required = true)]
        trace: Vec<PathBuf>,
        #[command(flatten)]
        run: RunArgs,
        /// The directory to write into (created if missing).
        #[arg(short, long)]
        output: PathBuf,
        /// Skip the search for the smallest capacity of each policy (faster on huge traces).
        #[arg(long)]
        no_search: bool,
        /// Write into a folder that is neither empty nor an earlier report (recognised by its
        /// summary.json); files there with a report's names are replaced.
        #[arg(long)]
        force: bool,
        /// Print summary.json to stdout as well.
        #[arg(long)]
        json: bool,
        /// Put the PNGs inside report.md as data: URIs (one file that shows its pictures in
        /// editors, GitLab and most wikis; GitHub drops data: images, so there attach the PNGs).
        #[arg(long)]
        inline_pictures: bool,
    },
    /// Compare two runs: peaks, OOMs, and per call site the bytes at the peak and allocation counts.
    #[command(
        long_about = "Compare two traces, A then B (e.g. before and after a change, or a trace and its \
replay under other settings): peak reserved, requested and allocated bytes, OOMs, and per call \
site the live bytes at each trace's peak of requested bytes and the number of allocations, \
largest changes first. Call sites are matched by their frames, not their ids. With -o DIR, \
also timeline-overlay.svg (both runs' reserved and allocated bytes) and diff.json.",
        after_help = "Examples:\n  alloctrace diff traces/frag_oom.default.atrace traces/frag_oom.expandable.atrace\n  \
alloctrace replay traces/gpt2_train.default.atrace --conf expandable_segments:True -o sim.atrace\n  \
alloctrace diff traces/gpt2_train.default.atrace sim.atrace -o diff/"
    )]
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Write timeline-overlay.svg and diff.json into this directory.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// One view across the ranks of a distributed job: per-rank peaks, the peaking rank, the call sites that differ.
    #[command(
        long_about = "One view across ranks: give one trace or PyTorch snapshot (.pickle) per rank. A table \
per rank (peak reserved and allocated with their event and time, OOMs, fragmentation at the peak, \
device calls), the rank that peaks, the skew between ranks (highest peak / median peak), the call \
sites whose live bytes at each rank's peak differ most, and (with -o) a picture: per-rank peak bars \
and the ranks' allocated bytes aligned on iterations, not wall time. A trace's rank comes from a \
`rank=R` note in its header, else `rank{R}`, `rank_R` or the device (`cuda{N}`) in its file name, \
else its position.",
        after_help = "Example:\n  alloctrace ranks snapshot_rank0.pickle snapshot_rank1.pickle -o ranks.svg\n  \
alloctrace ranks run.rank_0.atrace run.rank_1.atrace run.rank_2.atrace --json"
    )]
    Ranks {
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Write the picture (SVG) here.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Fragmentation four ways, over time and at one moment, with the segment map.
    #[command(
        long_about = "Measure fragmentation four ways, each named and defined in the output:\n  \
1. reserved vs allocated: 1 - allocated / reserved (PyTorch's \"reserved but unallocated\");\n  \
2. contiguity: 1 - largest free block / total free (why a request fails although memory is free);\n  \
3. internal (rounding slack inside blocks) vs external (free blocks inside segments);\n  \
4. the gap between peak reserved and an offline plan that knows every lifetime in advance.\n\n\
Each is summarised over the run (mean, max, value at peak reserved) and shown at one moment \
(--at): peak reserved, the first out-of-memory, the end, or an event index. At that moment a \
segment map lists every segment with its allocated and free blocks and its largest free block, \
so you can see why a request did not fit: a 1 GiB tensor needs one contiguous block.\n\n\
The layout comes from replaying the trace under its recorded settings and capacity; for \
imported and recorded traces the replay reuses the recorded segment addresses, so blocks sit \
where they sat in the real run.",
        after_help = "Examples:\n  alloctrace frag traces/frag_oom.default.atrace --at oom\n  \
alloctrace frag traces/gpt2_train.default.atrace --json"
    )]
    Frag {
        trace: PathBuf,
        #[command(flatten)]
        run: RunArgs,
        /// The moment to show: peak (peak reserved), oom (the out-of-memory that ended the run), end, or an
        /// event index. Default: oom when the trace ends in one, else peak.
        #[arg(long, value_parser = parse_at)]
        at: Option<analyzer::frag::At>,
        /// Lines of the segment map to print (segments of the same shape share a line).
        #[arg(long, default_value_t = 40)]
        max_segments: usize,
        #[arg(long)]
        json: bool,
    },
    /// Live allocations at the end, growth per iteration by call site, and what pins reserved memory.
    #[command(
        long_about = "Find leaks and what they cost.\n\n\
Live at the end: allocations never freed, grouped by call site (the innermost frame of your \
code; frames inside torch and site-packages are skipped), with their count, bytes and age.\n\n\
Growth: live bytes compared at the same phase of successive iterations. Iterations come from \
iteration marks, else from an annotation that repeats (e.g. Optimizer.zero_grad), else from \
the repeating pattern of allocations (call site and size). Call sites whose live bytes rise \
every iteration are reported as \"+N allocations, +X per iteration from FILE:LINE\".\n\n\
Retention: a segment goes back to the device only when every block in it is free, so one \
small live tensor can pin a 20 MiB segment. For the end of the run (or --at EVENT) this lists \
what empty_cache() would free now, and what it would free if a call site released its blocks.",
        after_help = "Example:\n  alloctrace leaks traces/leak_list_append.default.atrace"
    )]
    Leaks {
        trace: PathBuf,
        /// Analyse retention after this event index instead of at the end.
        #[arg(long)]
        at: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Write the trace for another viewer: PyTorch's memory_viz (a snapshot pickle) or Perfetto.
    #[command(
        long_about = "Write the trace in a format that another viewer opens.\n\n\
memory-viz: a PyTorch memory snapshot pickle (what torch.cuda.memory._dump_snapshot writes), for \
https://pytorch.org/memory_viz and `python -m torch.cuda._memory_viz`. Every allocation, free, \
segment and OOM becomes a trace entry, call sites become frames, marks become \
external_annotations, and `segments` holds the state at the end. `alloctrace import torch` reads \
it back (pass the memory limit with --capacity: snapshots do not hold it).\n\n\
perfetto: Chrome trace-event JSON for https://ui.perfetto.dev and chrome://tracing: counter \
tracks of reserved, allocated and active bytes (all streams, and per stream when there are \
several), instant events for OOMs, cache releases and marks, and a slice per iteration. \
Counters are downsampled per time bucket keeping each bucket's lowest and highest values, so \
every peak is kept and the file stays small on any number of events.",
        after_help = "Examples:\n  alloctrace export traces/gpt2_train.default.atrace --format memory-viz -o gpt2.pickle\n  \
alloctrace export traces/gpt2_train.default.atrace --format perfetto -o gpt2.json"
    )]
    Export {
        trace: PathBuf,
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Where to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Perfetto: time buckets per counter track (each keeps its lowest and highest values).
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(2..=10_000_000))]
        buckets: u64,
        #[arg(long)]
        json: bool,
    },
    /// The OOM doctor: why the run ran out of memory, and what to change.
    #[command(
        long_about = "Explain the first out-of-memory of a trace (or its peak, when there is none).\n\n\
The trace is replayed under its recorded settings and capacity to rebuild the layout at the \
failure. PyTorch's OOM message is restated with each number explained (requested, the segment \
the allocator tried to get, capacity, allocated, reserved, reserved but unallocated, the largest \
free block, what the CUDA context and other processes hold when the trace knows it), then a \
verdict with its reason: true exhaustion (live tensors alone exceed the limit), fragmentation \
(enough free bytes, but no block large enough), cache not released, or steady growth (a leak).\n\n\
Evidence comes from replays at the same capacity: which allocator settings would have \
completed, the smallest capacity each needs, and, for fragmentation, a replay of the code \
change that allocates long-lived tensors before temporaries. Each setting gets one decision, \
which the what-if table, the advice, the report and the JSON all show:\n\
  advised       the whole job is in the trace (a complete run, or one recorded past its limit \
with `alloctrace record --capacity`) and its replay under the setting completes at the limit;\n\
  worth trying  the trace stops at the failure (a snapshot taken at the OOM) and the setting's \
replay serves the request that failed; the rest of the job is not in the trace, so it is at most \
predicted (from a repeated iteration) and never said to fit;\n\
  not advised   its replay fails there too.\n\n\
The text fits a screen: the verdict, the fix and its evidence, what is worth trying. \
--verbose adds the figures, call sites, the what-if table, growth and patterns.",
        after_help = "Examples:\n  alloctrace explain traces/frag_oom.default.atrace\n  \
alloctrace explain snap.pickle --capacity 6GiB --verbose\n  \
alloctrace explain traces/leak_list_append.default.atrace --json"
    )]
    Explain {
        trace: PathBuf,
        #[command(flatten)]
        run: RunArgs,
        /// Everything behind the verdict: the figures of the moment, call sites, categories, the
        /// what-if table, growth, the prediction's basis and the patterns.
        #[arg(long, short)]
        verbose: bool,
        /// For a trace that ends in an out-of-memory error: iterations to append (repeating the last
        /// whole one before the failure) to predict whether the rest of the job fits.
        #[arg(long, default_value_t = analyzer::outcome::DEFAULT_REPEATS, value_parser = clap::value_parser!(u32).range(1..=10000))]
        iterations: u32,
        #[arg(long)]
        json: bool,
    },
}

/// What the user says about the run that a snapshot does not store.
#[derive(Args)]
struct RunArgs {
    /// The memory limit the run ran under (set_per_process_memory_fraction): bytes or 6GiB, 1.5GB,
    /// 512MiB. Snapshots do not store it; without it an OOM's limit is inferred, and said to be.
    #[arg(long, value_parser = parse_capacity)]
    capacity: Option<u64>,
    /// The PYTORCH_CUDA_ALLOC_CONF the run used (snapshots do not store it).
    #[arg(long, value_parser = user_conf)]
    conf: Option<AllocatorConfig>,
    /// For a PyTorch snapshot (.pickle, imported on the fly): the device to analyse.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// The PyTorch release the run used, e.g. 2.12 (default: the trace's, else 2.11); its
    /// allocator is the one followed.
    #[arg(long, value_parser = parse_torch_version)]
    torch_version: Option<TorchVersion>,
}

impl RunArgs {
    fn facts(self) -> analyzer::input::RunFacts {
        analyzer::input::RunFacts {
            capacity_bytes: self.capacity,
            conf: self.conf,
            device: self.device,
            torch_version: self.torch_version,
        }
    }
}

fn parse_torch_version(s: &str) -> Result<TorchVersion, String> {
    TorchVersion::parse(s)
}

#[derive(Args)]
struct PolicyArgs {
    /// Allocator settings as PYTORCH_CUDA_ALLOC_CONF, e.g. "max_split_size_mb:64,expandable_segments:True".
    /// Default: the settings recorded in the trace.
    #[arg(long, value_parser = user_conf)]
    conf: Option<AllocatorConfig>,
    /// Memory limit (like torch.cuda.set_per_process_memory_fraction): bytes or 6GiB, 1.5GB, 512MiB.
    /// Default: the trace's own limit, if any.
    #[arg(long, value_parser = parse_capacity, conflicts_with = "unlimited")]
    capacity: Option<u64>,
    /// Replay without any memory limit, even if the trace recorded one.
    #[arg(long)]
    unlimited: bool,
    /// Follow this PyTorch release's allocator, e.g. 2.12 (default: the trace's, else 2.11).
    #[arg(long, value_parser = parse_torch_version)]
    torch_version: Option<TorchVersion>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ImportFormat {
    /// A PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot).
    Torch,
}

/// `record --allocator`.
#[derive(Clone, Copy, ValueEnum)]
enum RecordAllocator {
    /// PyTorch's own caching allocator (the job runs exactly as natively).
    Pytorch,
    /// alloctrace's engine through PyTorch's pluggable allocator.
    Alloctrace,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    /// A PyTorch memory snapshot pickle (pytorch.org/memory_viz, torch.cuda._memory_viz).
    MemoryViz,
    /// Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing).
    Perfetto,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlotKind {
    /// Memory over time.
    Timeline,
    /// The segment map at a moment.
    Segments,
    /// Reserved bytes per what-if policy over time.
    Whatif,
    /// Fragmentation measures over time.
    Frag,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlotX {
    /// Time since the trace's start.
    Time,
    /// Event index.
    Event,
}

fn parse_plot_at(s: &str) -> Result<analyzer::plot::At, String> {
    s.parse()
}

fn parse_at(s: &str) -> Result<analyzer::frag::At, String> {
    analyzer::frag::At::parse(s)
}

/// Checks a configuration string but keeps it as written (it is handed to the recorder).
fn parse_conf_string(s: &str) -> Result<String, String> {
    user_conf(s).map(|_| s.to_string())
}

/// Checks a capacity but keeps it as written.
fn parse_capacity_string(s: &str) -> Result<String, String> {
    parse_capacity(s).map(|_| s.to_string())
}

/// A memory limit: a byte size above zero (no limit is the default, or `--unlimited`).
fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_bytes(s)? {
        0 => Err("a limit of 0 bytes fits nothing; leave --capacity out for no limit".into()),
        b => Ok(b),
    }
}

fn dispatch(cli: Cli, out: &mut dyn Write) -> anyhow::Result<i32> {
    match cli.command {
        Command::Import {
            format: ImportFormat::Torch,
            snapshot,
            output,
            capacity,
            device,
            device_name,
            device_memory,
            torch_version,
            json,
        } => cmd::import::run(
            &cmd::import::ImportCmdOptions {
                snapshot,
                output,
                import: analyzer::import::torch::ImportOptions {
                    device,
                    capacity_bytes: capacity,
                    device_name,
                    device_total_bytes: device_memory,
                    torch_version,
                },
                json,
            },
            out,
        ),
        Command::Dump { trace } => cmd::dump::run(&cmd::dump::DumpOptions { trace }, out),
        Command::Summary { trace, json, categories } => {
            cmd::summary::run(&cmd::summary::SummaryOptions { trace, json, categories }, out)
        }
        Command::Replay { trace, policy, output, json } => cmd::replay::run(
            &cmd::replay::ReplayCmdOptions {
                trace,
                replay: analyzer::replay::ReplayOptions {
                    config: policy.conf,
                    capacity_bytes: policy.capacity,
                    unlimited: policy.unlimited,
                    output,
                    ..Default::default()
                },
                torch_version: policy.torch_version,
                json,
            },
            out,
        ),
        Command::Whatif { trace, capacity, conf, device, torch_version, no_search, iterations, json } => {
            cmd::whatif::run(
                &cmd::whatif::WhatifCmdOptions {
                    trace,
                    facts: analyzer::input::RunFacts { capacity_bytes: capacity, conf, device, torch_version },
                    capacity_bytes: capacity,
                    search_capacity: !no_search,
                    repeats: iterations,
                    json,
                },
                out,
            )
        }
        Command::Synth {
            events,
            seed,
            output,
            conf,
            layers,
            streams,
            leak_bytes_per_iter,
            fragment,
            realistic,
            json,
        } => cmd::synth::run(
            &analyzer::synth::SynthOptions {
                events,
                seed,
                output,
                config: conf.unwrap_or_default(),
                layers,
                streams,
                leak_bytes_per_iter,
                fragment,
                realistic,
            },
            json,
            out,
        ),
        Command::Plot { trace, kind, output, at, stacked, x, json } => cmd::plot::run(
            &cmd::plot::PlotCmdOptions {
                trace,
                kind: match kind {
                    PlotKind::Timeline => analyzer::plot::Kind::Timeline,
                    PlotKind::Segments => analyzer::plot::Kind::Segments,
                    PlotKind::Whatif => analyzer::plot::Kind::Whatif,
                    PlotKind::Frag => analyzer::plot::Kind::Frag,
                },
                output,
                at,
                stacked,
                x: match x {
                    PlotX::Time => analyzer::plot::XAxis::Time,
                    PlotX::Event => analyzer::plot::XAxis::Event,
                },
                json,
            },
            out,
        ),
        Command::Report { trace, run, output, no_search, force, json, inline_pictures } => cmd::report::run(
            &cmd::report::ReportCmdOptions {
                traces: trace,
                facts: run.facts(),
                output,
                search_capacity: !no_search,
                json,
                force,
                inline_pictures,
            },
            out,
        ),
        Command::Ranks { traces, output, json } => {
            cmd::ranks::run(&cmd::ranks::RanksCmdOptions { traces, output, json }, out)
        }
        Command::Diff { a, b, output, json } => cmd::diff::run(&cmd::diff::DiffCmdOptions { a, b, output, json }, out),
        Command::Frag { trace, run, at, max_segments, json } => {
            cmd::frag::run(&cmd::frag::FragCmdOptions { trace, facts: run.facts(), at, max_segments, json }, out)
        }
        Command::Leaks { trace, at, json } => {
            cmd::leaks::run(&cmd::leaks::LeaksCmdOptions { trace, at_event: at, json }, out)
        }
        Command::Record { output, conf, capacity, after_limit, stacks, lib, quiet, allocator, command } => {
            let allocator = match allocator {
                RecordAllocator::Pytorch => cmd::record::Allocator::Pytorch,
                RecordAllocator::Alloctrace => cmd::record::Allocator::Alloctrace,
            };
            cmd::record::run(&cmd::record::RecordOptions {
                output,
                conf,
                capacity,
                after_limit,
                stacks,
                lib,
                command,
                quiet,
                allocator,
                convert_history: Some(cmd::record_history::convert_histories),
            })
        }
        Command::Export { trace, format, output, buckets, json } => cmd::export::run(
            &cmd::export::ExportCmdOptions {
                trace,
                format: match format {
                    ExportFormat::MemoryViz => cmd::export::Format::MemoryViz,
                    ExportFormat::Perfetto => cmd::export::Format::Perfetto,
                },
                output,
                buckets: buckets as usize,
                json,
            },
            out,
        ),
        Command::Explain { trace, run, verbose, iterations, json } => cmd::explain::run(
            &cmd::explain::ExplainCmdOptions { trace, facts: run.facts(), repeats: iterations, json, verbose },
            out,
        ),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// `alloctrace --version`: the tool's version and the newest trace format it reads and writes.
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("{} (trace format {})", env!("CARGO_PKG_VERSION"), recorder::trace::FORMAT_VERSION)
});

/// Parses the command line; usage errors become one line on stderr and exit code 2.
fn parse_args() -> Cli {
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
            std::process::exit(exit::ERROR)
        }
    }
}

/// One line from clap's usage error: its message with the lines that belong to it (the missing
/// arguments, the possible values, a suggestion), and which command's `--help` to read.
fn usage_error_line(text: &str, help: &str) -> String {
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

fn main() {
    let cli = parse_args();
    let stdout = std::io::stdout();
    // Strings from a trace reach the output: no control character gets to the terminal raw.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, analyzer::escape::TerminalWriter::new(stdout.lock()));
    let code = match dispatch(cli, &mut out).and_then(|code| {
        out.flush()?;
        Ok(code)
    }) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => exit::OK,
        Err(e) => {
            let _ = out.flush();
            eprintln!("alloctrace: error: {}", analyzer::escape::terminal(&format!("{e:#}")));
            if analyzer::output::TooLarge::is_cause_of(&e) {
                exit::TOO_LARGE
            } else {
                exit::ERROR
            }
        }
    };
    std::process::exit(code);
}
