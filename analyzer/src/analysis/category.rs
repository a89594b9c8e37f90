//! What the memory is for: each allocation gets a category (parameter, gradient, optimizer
//! state, activation, temporary, other, or unknown) from the phase that allocated it and its
//! lifetime.
//!
//! **Phases.** A trace with `phase` marks (`forward`, `backward`, `optimizer`...) gives them
//! directly. Otherwise they come from each allocation's frames (innermost first):
//! * backward, if any frame is autograd's: `Tensor.backward`, `torch.autograd.backward`/`grad`,
//!   the engine (its C++ frames where they are recorded, or a custom function's backward called
//!   by it), activation checkpointing's recomputation;
//! * else what the innermost frame that tells says (see `frame_phase`): the optimizer step
//!   (`torch/optim/`, gradient clipping, `_foreach_` kernels), forward (module forwards under
//!   `torch/nn/modules/`, `torch/nn/functional.py`, the models of transformers, torchvision and
//!   timm, Lightning's `training_step`), or no phase (`zero_grad`, torchvision's transforms).
//!   The innermost wins: Lightning runs the forward inside `optimizer.step(closure)`;
//! * other frames: no phase (the program's own tensors: a batch, a metric).
//!
//! An allocation without frames inherits the phase of the allocation before it: autograd runs
//! backward on its own threads, whose allocations PyTorch records without Python frames.
//! Consecutive allocations of one phase form a **run** (one forward, one backward...); a
//! free belongs to the run in which it happens.
//!
//! **Categories**, from the allocating run and the free:
//! * parameter: allocated before the first forward and still live at the second forward (or at
//!   the end, if there is one forward);
//! * gradient: DistributedDataParallel's gradient buckets (frames of its `_ddp_init_helper` or
//!   `_pre_forward`) that outlive their phase; else allocated in backward, freed after that backward and by the next one (by
//!   `zero_grad`), or never if no backward follows;
//! * gradient, too: what DistributedDataParallel's construction keeps, where a `gradient
//!   buckets` mark (which the recording shim puts around it) starts its phase;
//! * optimizer state: allocated in a step, freed after that step (or never);
//! * activation: allocated in forward, freed in the backward that follows;
//! * temporary: freed in the run that allocated it;
//! * other: the rest (the program's own tensors, a forward output kept past its backward, the
//!   cuBLAS workspace...);
//! * unknown: in a trace that ends in an out-of-memory error, what is still held there and was
//!   made in the step the error cut short (a forward whose backward never ran or failed, the
//!   backward or optimizer step that failed): an activation and a kept output, or a gradient and
//!   a temporary, are told apart only by when they are freed. No checkpointing estimate is made
//!   where unknown bytes are live at the moment it is about.
//!
//! Bytes are the blocks handed out (else the request rounded up to 512 bytes, as PyTorch rounds
//! it), live from the allocation to the completed free.

use crate::model::Trace;
use anyhow::Result;
use recorder::trace::{Event, Frame, MarkKind};
use serde::Serialize;
use std::collections::HashMap;

/// The categories, in the order they are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Temporary,
    Other,
    Unknown,
}

pub const CATEGORIES: [Category; 7] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
    Category::Temporary,
    Category::Other,
    Category::Unknown,
];

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Other => "other",
            Category::Unknown => "unknown",
        }
    }
    /// The name in a sentence about bytes ("activations 61%"). What the trace cannot tell is
    /// said as what it is: blocks made in the step that failed, whose end would have told.
    pub fn plural(self) -> &'static str {
        match self {
            Category::Parameter => "parameters",
            Category::Gradient => "gradients",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activations",
            Category::Temporary => "temporaries",
            Category::Other => "other",
            Category::Unknown => "the failing step's",
        }
    }
}

/// A phase of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
    /// DistributedDataParallel being built (a `gradient buckets` mark): what it keeps is its
    /// gradient buckets.
    Buckets,
    /// Frames that belong to none of the above.
    None,
}

/// The phase of an allocation from its frames (see the module documentation); `None` when there
/// are no frames.
pub fn phase_of_frames(frames: &[Frame]) -> Option<Phase> {
    if frames.is_empty() {
        return None;
    }
    let files: Vec<String> = frames.iter().map(|f| f.file.replace('\\', "/")).collect();
    // Backward wherever it is in the stack: a forward recomputed by activation checkpointing, or
    // a backward run inside an optimizer's closure (Lightning), is backward work.
    let outermost = frames.len() - 1;
    if frames.iter().zip(&files).enumerate().any(|(k, (f, file))| is_backward_frame(f, file, k == outermost)) {
        return Some(Phase::Backward);
    }
    // Else the innermost frame that tells: a forward inside an optimizer's closure (Lightning's
    // `training_step` under `optimizer.step(closure)`) is a forward.
    for (f, file) in frames.iter().zip(&files) {
        if let Some(p) = frame_phase(f, file) {
            return Some(p);
        }
    }
    Some(Phase::None)
}

/// Whether a frame belongs to backward: `Tensor.backward`, `torch.autograd.backward`/`grad` and
/// the engine's entry (`torch/autograd/graph.py`); activation checkpointing's recomputation
/// (`torch/utils/checkpoint.py`: `backward`, `recompute_fn`, `unpack_hook`); the autograd
/// engine's own frames where C++ frames are recorded (`torch::autograd::Engine::...`, the
/// generated `...Backward0::apply`); and, as the outermost frame, `apply` in
/// `torch/autograd/function.py`: a custom `autograd.Function`'s backward called by the engine
/// on its own thread (in a forward the same function has the program's frames outside it).
fn is_backward_frame(f: &Frame, file: &str, outermost: bool) -> bool {
    let name = f.function.as_str();
    (file.ends_with("torch/_tensor.py") && name == "backward")
        || (file.ends_with("torch/autograd/__init__.py") && matches!(name, "backward" | "grad" | "_make_grads"))
        || file.ends_with("torch/autograd/graph.py")
        || (file.ends_with("torch/utils/checkpoint.py")
            && matches!(name, "backward" | "recompute_fn" | "unpack_hook" | "unpack_hook_with_error_cb"))
        || (outermost && file.ends_with("torch/autograd/function.py") && name == "apply")
        || name.contains("torch::autograd::Engine::")
        || name.contains("torch::autograd::generated::")
        || name.contains("PythonEngine::")
}

/// A forward's function name: `forward`, `forward_features` (timm, torchvision), or
/// `eager_attention_forward` (transformers).
fn is_forward_name(name: &str) -> bool {
    name == "forward" || name.starts_with("forward_") || name.ends_with("_forward")
}

/// What one frame says about the phase (backward aside), if anything:
/// * optimizer step: a frame in `torch/optim/` (`adamw.py` `step`, `_multi_tensor_adamw`,
///   `_init_group`...) other than `zero_grad`; gradient clipping (`torch/nn/utils/clip_grad.py`,
///   done just before the step); and the `_foreach_`/`_fused_` kernels where C++ frames are
///   recorded;
/// * none: `zero_grad` (between steps: it frees gradients, it makes no state), and
///   torchvision's transforms (data preparation, although they are modules);
/// * forward: `forward`, `_call_impl` or `_wrapped_call_impl` in `torch/nn/modules/`, any frame
///   in `torch/nn/functional.py`, and a forward (see [`is_forward_name`]) in the models of
///   transformers (`modeling_*.py`, `activations.py`, `integrations/`...), torchvision or timm;
///   Lightning's `training_step`, `validation_step`, `test_step` and `predict_step`.
fn frame_phase(f: &Frame, file: &str) -> Option<Phase> {
    let name = f.function.as_str();
    if name == "zero_grad" {
        return Some(Phase::None);
    }
    if file.contains("torch/optim/")
        || file.ends_with("torch/nn/utils/clip_grad.py")
        || name.contains("_foreach_")
        || ["_fused_adam", "_fused_sgd", "_fused_adagrad"].iter().any(|k| name.contains(k))
    {
        return Some(Phase::Optimizer);
    }
    if file.contains("torchvision/transforms/") {
        return Some(Phase::None);
    }
    let module = file.contains("torch/nn/modules/") && matches!(name, "forward" | "_call_impl" | "_wrapped_call_impl");
    let library = ["transformers/", "torchvision/", "timm/"].iter().any(|p| file.contains(p)) && is_forward_name(name);
    let lightning = (file.contains("lightning/pytorch/") || file.contains("pytorch_lightning/"))
        && matches!(name, "training_step" | "validation_step" | "test_step" | "predict_step");
    if module || library || lightning || file.ends_with("torch/nn/functional.py") {
        return Some(Phase::Forward);
    }
    None
}

/// DistributedDataParallel's gradient buckets: made when it is built (`_ddp_init_helper`) and
/// when it rebuilds them before a forward (`_pre_forward`).
fn is_ddp_bucket(frames: &[Frame]) -> bool {
    frames.iter().any(|f| {
        f.file.replace('\\', "/").ends_with("torch/nn/parallel/distributed.py")
            && matches!(f.function.as_str(), "_ddp_init_helper" | "_pre_forward")
    })
}

/// The phase a `phase` mark starts.
fn phase_of_mark(text: &str) -> Phase {
    let t = text.to_ascii_lowercase();
    if t.starts_with("forward") {
        Phase::Forward
    } else if t.starts_with("backward") {
        Phase::Backward
    } else if t.starts_with("optim") || t.starts_with("step") {
        Phase::Optimizer
    } else if t.starts_with("gradient buckets") {
        Phase::Buckets
    } else {
        Phase::None
    }
}

/// The categories a table shows: every one but `unknown`, and `unknown` where it holds bytes
/// (`unknown_bytes`: the most it held).
pub fn shown(unknown_bytes: u64) -> impl Iterator<Item = Category> {
    CATEGORIES.into_iter().filter(move |&c| c != Category::Unknown || unknown_bytes > 0)
}

/// Bytes per category.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ByCategory {
    pub parameter: u64,
    pub gradient: u64,
    pub optimizer_state: u64,
    pub activation: u64,
    pub temporary: u64,
    pub other: u64,
    /// Allocations whose category the trace cannot tell: still held when it ended in an
    /// out-of-memory error, in the step whose end would have told.
    pub unknown: u64,
}

impl ByCategory {
    pub fn get(&self, c: Category) -> u64 {
        match c {
            Category::Parameter => self.parameter,
            Category::Gradient => self.gradient,
            Category::OptimizerState => self.optimizer_state,
            Category::Activation => self.activation,
            Category::Temporary => self.temporary,
            Category::Other => self.other,
            Category::Unknown => self.unknown,
        }
    }
    fn get_mut(&mut self, c: Category) -> &mut u64 {
        match c {
            Category::Parameter => &mut self.parameter,
            Category::Gradient => &mut self.gradient,
            Category::OptimizerState => &mut self.optimizer_state,
            Category::Activation => &mut self.activation,
            Category::Temporary => &mut self.temporary,
            Category::Other => &mut self.other,
            Category::Unknown => &mut self.unknown,
        }
    }
    pub fn total(&self) -> u64 {
        CATEGORIES.iter().fold(0u64, |t, &c| t.saturating_add(self.get(c)))
    }
    /// The categories holding bytes with their share of the total, largest first (ties in the
    /// order of [`CATEGORIES`]).
    pub fn shares(&self) -> Vec<(Category, f64)> {
        let total = self.total().max(1) as f64;
        let mut v: Vec<(Category, f64)> =
            CATEGORIES.iter().filter(|&&c| self.get(c) > 0).map(|&c| (c, self.get(c) as f64 / total)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
    /// "activations 61%, optimizer state 22%, ...": every category holding bytes, largest first.
    pub fn shares_text(&self) -> String {
        let pct = |f: f64| if f < 0.005 { "under 1%".to_string() } else { format!("{:.0}%", f * 100.0) };
        self.shares().iter().map(|(c, f)| format!("{} {}", c.plural(), pct(*f))).collect::<Vec<_>>().join(", ")
    }
}

/// Bytes by category at the peak and the most each category held.
#[derive(Debug, Clone, Serialize)]
pub struct Categories {
    /// Where the phases came from: `phase marks` or `frames`.
    pub phases_from: &'static str,
    /// Forward runs seen (about one per iteration).
    pub forward_passes: usize,
    /// The event at which allocated bytes first reached their peak.
    pub peak_event: u64,
    /// The trace records block sizes; where it does not, each request counts rounded up to 512
    /// bytes (PyTorch's smallest rounding), and the peak is of those bytes.
    pub block_sizes_known: bool,
    /// Live bytes by category at that peak (they add up to the peak of allocated bytes).
    pub at_peak: ByCategory,
    /// The most live bytes of each category at any moment (not at the same moment).
    pub max: ByCategory,
    /// Allocations per category.
    pub allocations: ByCategory,
    /// Over time, at most [`TIMELINE_COLUMNS`] samples: for each equal run of events, the live
    /// bytes by category when their total was highest in that run (a stacked timeline).
    pub over_time: Vec<CategorySample>,
    /// Live bytes by category after the event asked for ([`analyze_at`]: explain's moment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_moment: Option<CategorySample>,
    /// What activation checkpointing would do to the peak, estimated (`null`: no activations).
    pub checkpointing: Option<CheckpointEstimate>,
}

impl Categories {
    /// The peak the categories are taken at, in words.
    pub fn peak_words(&self) -> &'static str {
        if self.block_sizes_known {
            "the peak of allocated bytes"
        } else {
            "the peak of live requests, each rounded up to 512 bytes as the trace has no block sizes"
        }
    }
}

/// An estimate of the peak of allocated bytes under activation checkpointing, from the trace's
/// own activations (see `checkpoint_estimate` in this module for what it assumes).
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointEstimate {
    /// The peak of allocated bytes as recorded (the categories' total at their peak).
    pub peak_bytes: u64,
    /// Activations live at that peak.
    pub activation_bytes_at_peak: u64,
    /// The estimated peak with the forward's activations in this many blocks of equal bytes,
    /// each freed when its block's forward ends and recomputed in backward when backward
    /// reaches it.
    pub blocks: Vec<CheckpointRow>,
}

/// One row of [`CheckpointEstimate::blocks`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CheckpointRow {
    pub blocks: u32,
    pub peak_bytes: u64,
}

/// The block counts [`CheckpointEstimate`] is computed for.
pub const CHECKPOINT_BLOCKS: [u32; 5] = [2, 4, 8, 16, 32];

/// Samples of [`Categories::over_time`].
pub const TIMELINE_COLUMNS: u64 = 200;

/// Live bytes by category after event `event`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CategorySample {
    pub event: u64,
    pub bytes: ByCategory,
}

struct Alloc {
    bytes: u64,
    alloc_event: u64,
    run: usize,
    /// The run in which the program freed it (`FreeRequested`), if it did.
    free_run: Option<usize>,
    /// The event at which its block came back (`FreeCompleted`), if it did.
    completed: Option<u64>,
    /// Made by DDP for its gradient buckets.
    bucket: bool,
}

/// Categories of a trace's allocations; `None` when no allocation has a phase (no phase marks,
/// no frames of PyTorch's forward, backward or optimizer).
pub fn analyze(trace: &Trace) -> Result<Option<Categories>> {
    analyze_at(trace, None)
}

/// [`analyze`], with the live bytes by category after event `moment` too
/// ([`Categories::at_moment`]).
pub fn analyze_at(trace: &Trace, moment: Option<u64>) -> Result<Option<Categories>> {
    let mut sites: HashMap<u32, (Option<Phase>, bool)> = HashMap::new();
    let mut runs: Vec<Phase> = Vec::new();
    // The event at which each run starts.
    let mut run_starts: Vec<u64> = Vec::new();
    let mut allocs: Vec<Alloc> = Vec::new();
    let mut by_id: crate::model::ids::IdMap<usize> = Default::default();
    let mut current: Option<Phase> = None;
    let mut marked = false;
    let mut any_frames = false;
    // Whether the current run has seen an allocation or a free: a mark that ends an empty run
    // replaces it (a forward whose first step is DistributedDataParallel's bucket rebuild, marked
    // as such, stays one forward).
    let mut run_used = false;
    trace.scan(|i, r| match &r.event {
        Event::CallSite { id, frames } => {
            any_frames |= !frames.is_empty();
            sites.insert(*id, (phase_of_frames(frames), is_ddp_bucket(frames)));
        }
        Event::Mark { kind: MarkKind::Phase, text } => {
            marked = true;
            let p = phase_of_mark(text);
            if current != Some(p) {
                if !run_used && !runs.is_empty() {
                    runs.pop();
                    run_starts.pop();
                }
                if runs.last() == Some(&p) {
                    run_used = true;
                } else {
                    runs.push(p);
                    run_starts.push(i);
                    run_used = false;
                }
                current = Some(p);
            }
        }
        Event::Alloc { id, requested_bytes, block_bytes, callsite, .. } => {
            if !marked {
                if let Some(p) = sites.get(callsite).and_then(|s| s.0) {
                    if current != Some(p) {
                        runs.push(p);
                        run_starts.push(i);
                        current = Some(p);
                    }
                }
            }
            if runs.is_empty() {
                runs.push(Phase::None);
                run_starts.push(i);
                current = Some(Phase::None);
            }
            let bytes =
                if *block_bytes > 0 { *block_bytes } else { requested_bytes.max(&1).div_ceil(512).saturating_mul(512) };
            by_id.insert(*id, allocs.len());
            let bucket = sites.get(callsite).is_some_and(|s| s.1);
            run_used = true;
            allocs.push(Alloc { bytes, alloc_event: i, run: runs.len() - 1, free_run: None, completed: None, bucket });
        }
        Event::FreeRequested { id, .. } => {
            run_used = true;
            if let Some(&k) = by_id.get(id) {
                allocs[k].free_run = Some(runs.len().saturating_sub(1));
            }
        }
        Event::FreeCompleted { id, .. } => {
            run_used = true;
            if let Some(k) = by_id.remove(id) {
                allocs[k].completed = Some(i);
                if allocs[k].free_run.is_none() {
                    allocs[k].free_run = Some(runs.len().saturating_sub(1));
                }
            }
        }
        _ => {}
    })?;
    if (!marked && !any_frames) || !runs.iter().any(|&p| p != Phase::None) {
        // Nothing to classify from: no phase marks, and no frames of PyTorch's forward,
        // backward or optimizer.
        return Ok(None);
    }
    let forwards: Vec<usize> = (0..runs.len()).filter(|&k| runs[k] == Phase::Forward).collect();
    let first_forward = forwards.first().copied().unwrap_or(usize::MAX);
    let second_forward = forwards.get(1).copied();
    let last_run = runs.len() - 1;
    // A trace that ends in an out-of-memory error stops in the middle of a step: what is still
    // held there was never freed, and whether it would have been (an activation in the backward
    // that never came, a gradient or a temporary of the backward that failed) cannot be told.
    let cut = trace.facts.fatal_oom().is_some();
    // The first backward and forward run after each run, found once (a search per allocation
    // cost the runs times the allocations).
    let (mut next_backward_after, mut next_forward_after) = (vec![None; runs.len()], vec![None; runs.len()]);
    for k in (0..runs.len().saturating_sub(1)).rev() {
        next_backward_after[k] = if runs[k + 1] == Phase::Backward { Some(k + 1) } else { next_backward_after[k + 1] };
        next_forward_after[k] = if runs[k + 1] == Phase::Forward { Some(k + 1) } else { next_forward_after[k + 1] };
    }
    let categories: Vec<Category> = allocs
        .iter()
        .map(|a| {
            let freed_in = a.free_run;
            let same_run = freed_in == Some(a.run);
            let held = cut && freed_in.is_none();
            match runs[a.run] {
                _ if (a.bucket || runs[a.run] == Phase::Buckets) && !same_run => Category::Gradient,
                Phase::Buckets => Category::Temporary,
                _ if a.run < first_forward => {
                    let alive = match (second_forward, freed_in) {
                        (_, None) => true,
                        (Some(s), Some(f)) => f >= s,
                        (None, Some(_)) => false,
                    };
                    if alive && first_forward != usize::MAX {
                        Category::Parameter
                    } else if held && first_forward == usize::MAX {
                        Category::Unknown
                    } else {
                        Category::Other
                    }
                }
                _ if same_run => Category::Temporary,
                Phase::Backward | Phase::Optimizer if held && a.run == last_run => Category::Unknown,
                Phase::Backward => {
                    // Alive until the next backward at most: the cuBLAS workspace of autograd's
                    // thread, made in the first backward and kept, is no gradient.
                    let next_backward = next_backward_after[a.run];
                    match (freed_in, next_backward) {
                        (Some(f), Some(b)) if f <= b => Category::Gradient,
                        (Some(_), None) | (None, None) => Category::Gradient,
                        _ => Category::Other,
                    }
                }
                Phase::Optimizer => Category::OptimizerState,
                Phase::Forward => {
                    // Freed in the backward that follows this forward.
                    let (next_backward, next_forward) = (next_backward_after[a.run], next_forward_after[a.run]);
                    if held && next_backward.is_none_or(|b| b == last_run) {
                        // The backward that would have freed it never ran, or failed.
                        return Category::Unknown;
                    }
                    match (freed_in, next_backward) {
                        (Some(f), Some(b))
                            if runs[f] == Phase::Backward && f >= b && next_forward.is_none_or(|n| f < n) =>
                        {
                            Category::Activation
                        }
                        _ => Category::Other,
                    }
                }
                Phase::None => Category::Other,
            }
        })
        .collect();
    // Live bytes by category over events: +bytes at the allocation, -bytes at the completed free.
    let mut deltas: Vec<(u64, i64, Category)> = Vec::with_capacity(allocs.len() * 2);
    let mut allocations = ByCategory::default();
    for (a, &c) in allocs.iter().zip(&categories) {
        *allocations.get_mut(c) += 1;
        deltas.push((a.alloc_event, signed(a.bytes), c));
        if let Some(e) = a.completed {
            deltas.push((e, -signed(a.bytes), c));
        }
    }
    deltas.sort_by_key(|d| d.0);
    let mut live = ByCategory::default();
    let mut max = ByCategory::default();
    let (mut total, mut peak, mut peak_event, mut at_peak) = (0i64, 0i64, 0u64, ByCategory::default());
    let events = trace.events.max(1);
    let columns = TIMELINE_COLUMNS.min(events);
    let mut over_time: Vec<CategorySample> = Vec::new();
    let mut column_best = (u64::MAX, -1i64);
    let mut at_moment = None;
    let mut k = 0;
    while k < deltas.len() {
        let e = deltas[k].0;
        if let Some(m) = moment.filter(|&m| e > m && at_moment.is_none()) {
            at_moment = Some(CategorySample { event: m, bytes: live });
        }
        while k < deltas.len() && deltas[k].0 == e {
            let (_, d, c) = deltas[k];
            let v = live.get_mut(c);
            *v = v.saturating_add_signed(d);
            total = total.saturating_add(d);
            k += 1;
        }
        for c in CATEGORIES {
            *max.get_mut(c) = max.get(c).max(live.get(c));
        }
        let column = e * columns / events;
        if column != column_best.0 || total > column_best.1 {
            if column != column_best.0 {
                over_time.push(CategorySample { event: e, bytes: live });
            } else if let Some(last) = over_time.last_mut() {
                *last = CategorySample { event: e, bytes: live };
            }
            column_best = (column, total);
        }
        if total > peak {
            peak = total;
            peak_event = e;
            at_peak = live;
        }
    }
    if let Some(m) = moment.filter(|_| at_moment.is_none()) {
        at_moment = Some(CategorySample { event: m, bytes: live });
    }
    let run_end = |r: usize| run_starts.get(r + 1).copied().unwrap_or(events);
    let activations: Vec<Activation> = allocs
        .iter()
        .zip(&categories)
        .filter(|(_, &c)| c == Category::Activation)
        .filter_map(|(a, _)| {
            Some(Activation {
                bytes: a.bytes,
                alloc: a.alloc_event,
                forward_end: run_end(a.run),
                backward_start: run_starts.get(a.free_run?).copied().unwrap_or(0),
                freed: a.completed?,
                forward: a.run,
            })
        })
        .collect();
    let others: Vec<(u64, i64)> = allocs
        .iter()
        .zip(&categories)
        .filter(|(_, &c)| c != Category::Activation)
        .flat_map(|(a, _)| {
            std::iter::once((a.alloc_event, signed(a.bytes))).chain(a.completed.map(|e| (e, -signed(a.bytes))))
        })
        .collect();
    // No estimate where the moments it is about hold bytes of unknown category: they may be
    // activations, which the estimate would leave out.
    let told = at_peak.unknown == 0 && at_moment.is_none_or(|m| m.bytes.unknown == 0);
    let checkpointing = (!activations.is_empty() && told).then(|| CheckpointEstimate {
        peak_bytes: peak.max(0) as u64,
        activation_bytes_at_peak: at_peak.activation,
        blocks: CHECKPOINT_BLOCKS
            .iter()
            .map(|&b| CheckpointRow { blocks: b, peak_bytes: checkpoint_estimate(&others, &activations, b) })
            .collect(),
    });
    Ok(Some(Categories {
        phases_from: if marked { "phase marks" } else { "frames" },
        forward_passes: forwards.len(),
        peak_event,
        // The summary's decision: every allocation recorded its block's size.
        block_sizes_known: trace.summary.peak_allocated.is_some(),
        at_peak,
        max,
        allocations,
        over_time,
        at_moment,
        checkpointing,
    }))
}

/// Bytes as a signed change: a hostile trace may claim sizes past `i64::MAX`, which count as
/// `i64::MAX`, and sums of them saturate rather than wrap.
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// An activation, for [`checkpoint_estimate`].
struct Activation {
    bytes: u64,
    alloc: u64,
    /// The event at which its forward ended (the next phase began).
    forward_end: u64,
    /// The event at which the backward that freed it began.
    backward_start: u64,
    /// The event at which its block came back, in backward.
    freed: u64,
    /// Its forward run.
    forward: usize,
}

/// The peak of allocated bytes if each forward's activations were checkpointed in `blocks`
/// blocks. What it assumes:
/// * each forward's activations, in the order they were allocated, fall into `blocks` blocks of
///   equal bytes (the trace does not say where the model's blocks begin);
/// * in the forward, a block's activations are freed when the block ends (where the next
///   block's first activation is allocated; the last block's at the end of the forward);
/// * in backward, they are allocated again (recomputed) when backward reaches the block: when
///   it has freed the activations of the block after it (the last block: when backward
///   begins), or at the block's own first free if that is sooner; and freed when they were;
/// * the blocks' inputs, which checkpointing keeps, are not counted, nor the recomputation's own
///   temporaries; every other allocation stays as recorded.
///
/// `others` are the other allocations' `(event, +bytes)` and `(event, -bytes)`.
fn checkpoint_estimate(others: &[(u64, i64)], activations: &[Activation], blocks: u32) -> u64 {
    let mut deltas: Vec<(u64, i64)> = others.to_vec();
    let mut k = 0;
    while k < activations.len() {
        // One forward's activations (they are in allocation order).
        let f = activations[k].forward;
        let end = k + activations[k..].iter().take_while(|a| a.forward == f).count();
        let group = &activations[k..end];
        let total = group.iter().map(|a| a.bytes as u128).sum::<u128>().max(1);
        let mut before = 0u128;
        let block_of: Vec<usize> = group
            .iter()
            .map(|a| {
                let b = (before * blocks as u128 / total) as usize;
                before += a.bytes as u128;
                b
            })
            .collect();
        // A block's forward ends where the next block's first activation is allocated (the last
        // block's where the forward ends). Backward reaches a block when it is done with the
        // block after it (its last free there; the last block: when backward begins), and at the
        // latest at the block's own first free.
        let n = blocks as usize;
        let mut first_free = vec![u64::MAX; n];
        let mut last_free = vec![0u64; n];
        let mut block_end = vec![group[0].forward_end; n];
        let mut backward_start = u64::MAX;
        for (k, (a, &b)) in group.iter().zip(&block_of).enumerate() {
            first_free[b] = first_free[b].min(a.freed);
            last_free[b] = last_free[b].max(a.freed);
            backward_start = backward_start.min(a.backward_start);
            if k > 0 && block_of[k - 1] < b {
                for e in &mut block_end[block_of[k - 1]..b] {
                    *e = a.alloc;
                }
            }
        }
        // Blocks without activations (one larger than a block's share) are skipped over.
        let mut reached = vec![u64::MAX; n];
        let mut after = backward_start;
        for b in (0..n).rev() {
            if first_free[b] == u64::MAX {
                continue;
            }
            reached[b] = after.min(first_free[b]);
            after = last_free[b];
        }
        for (a, &b) in group.iter().zip(&block_of) {
            let bytes = signed(a.bytes);
            let forward_end = block_end[b].clamp(a.alloc + 1, a.freed.max(a.alloc + 1));
            deltas.push((a.alloc, bytes));
            deltas.push((forward_end, -bytes));
            let again = reached[b].max(forward_end);
            if again < a.freed {
                deltas.push((again, bytes));
                deltas.push((a.freed, -bytes));
            }
        }
        k = end;
    }
    // Frees before allocations at one event, as the recorded order has them.
    deltas.sort_unstable();
    let (mut live, mut peak) = (0i64, 0i64);
    for (_, d) in deltas {
        live = live.saturating_add(d);
        peak = peak.max(live);
    }
    peak.max(0) as u64
}

/// Above this many events, `summary`, `explain`, `report` and `ranks` leave categories out
/// (`summary --categories` computes them): they take another pass over the trace and memory
/// per allocation.
pub const SUMMARY_MAX_EVENTS: u64 = 2_000_000;

/// Live bytes by category at one moment (explain's OOM or peak), with the checkpointing estimate.
#[derive(Debug, Clone, Serialize)]
pub struct AtMoment {
    pub event: u64,
    /// Where the phases came from: `phase marks` or `frames`.
    pub phases_from: &'static str,
    pub bytes: ByCategory,
    pub checkpointing: Option<CheckpointEstimate>,
}

/// Live bytes by category after event `event`; `None` when the trace has no phases or more than
/// [`SUMMARY_MAX_EVENTS`] events.
pub fn at_moment(trace: &Trace, event: u64) -> Result<Option<AtMoment>> {
    if !by_default(trace) {
        return Ok(None);
    }
    Ok(analyze_at(trace, Some(event))?.map(|c| AtMoment {
        event,
        phases_from: c.phases_from,
        bytes: c.at_moment.map(|m| m.bytes).unwrap_or_default(),
        checkpointing: c.checkpointing,
    }))
}

/// Whether a trace can have categories: it has call sites or marks.
pub fn possible(trace: &Trace) -> bool {
    let has = |k: &str| trace.summary.count(k) > 0;
    has("callsite") || has("mark")
}

/// Whether the analyses compute categories unasked: the trace can have them and has at most
/// [`SUMMARY_MAX_EVENTS`] events.
pub fn by_default(trace: &Trace) -> bool {
    possible(trace) && trace.summary.events <= SUMMARY_MAX_EVENTS
}

/// Categories for `summary`, from the trace it has open: computed [`by_default`], or `always`
/// where the trace can have them; else `None`.
pub fn of_summary(trace: &Trace, always: bool) -> Result<Option<Categories>> {
    if !(by_default(trace) || (always && possible(trace))) {
        return Ok(None);
    }
    analyze(trace)
}

/// What activation checkpointing would do (what it assumes included), as a clause that callers
/// introduce as an estimate.
pub fn checkpoint_text(k: &CheckpointEstimate) -> String {
    use crate::model::units::fmt_bytes;
    // Block counts whose peaks read the same are one figure ("2.25 GiB with 2 to 32 blocks").
    let mut rows: Vec<String> = Vec::new();
    let mut k0 = 0;
    while k0 < k.blocks.len() {
        let shown = fmt_bytes(k.blocks[k0].peak_bytes);
        let mut k1 = k0;
        while k1 + 1 < k.blocks.len() && fmt_bytes(k.blocks[k1 + 1].peak_bytes) == shown {
            k1 += 1;
        }
        rows.push(if k1 == k0 {
            format!("{shown} with {} blocks", k.blocks[k0].blocks)
        } else {
            format!("{shown} with {} to {} blocks", k.blocks[k0].blocks, k.blocks[k1].blocks)
        });
        k0 = k1 + 1;
    }
    format!(
        "activations hold {} at the peak of {}; with the forward's activations \
         checkpointed in blocks of equal bytes (each block's freed when the block's forward ends and \
         recomputed when backward reaches it; the blocks' kept inputs not counted, all else as recorded: a model \
         that turns more off under checkpointing, as transformers does its key/value cache, needs less) the peak \
         would be about {}",
        fmt_bytes(k.activation_bytes_at_peak),
        fmt_bytes(k.peak_bytes),
        rows.join(", ")
    )
}

/// Where the phases came from, in words (`phases_from` is `"phase marks"` or `"frames"`: the
/// frames of each allocation's call stack).
pub fn phases_from_text(phases_from: &str) -> &str {
    match phases_from {
        "frames" => "the call stacks",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(file: &str, function: &str) -> Frame {
        Frame { file: file.into(), line: 1, function: function.into() }
    }

    #[test]
    fn phases_from_frames() {
        let lib = "/usr/lib/python3/dist-packages/torch";
        assert_eq!(phase_of_frames(&[]), None);
        assert_eq!(
            phase_of_frames(&[f(&format!("{lib}/optim/adamw.py"), "_init_group"), f("train.py", "main")]),
            Some(Phase::Optimizer)
        );
        assert_eq!(
            phase_of_frames(&[f(&format!("{lib}/autograd/__init__.py"), "_make_grads"), f("train.py", "main")]),
            Some(Phase::Backward)
        );
        assert_eq!(
            phase_of_frames(&[f(&format!("{lib}/nn/modules/linear.py"), "forward"), f("train.py", "main")]),
            Some(Phase::Forward)
        );
        assert_eq!(phase_of_frames(&[f(&format!("{lib}/nn/functional.py"), "cross_entropy")]), Some(Phase::Forward));
        // Moving a model to the GPU is not a forward.
        assert_eq!(
            phase_of_frames(&[f(&format!("{lib}/nn/modules/module.py"), "_apply"), f("train.py", "main")]),
            Some(Phase::None)
        );
        assert_eq!(phase_of_mark("backward"), Phase::Backward);
        assert_eq!(phase_of_mark("optimizer.step"), Phase::Optimizer);
        assert_eq!(phase_of_mark("gradient buckets (DistributedDataParallel)"), Phase::Buckets);
        assert_eq!(phase_of_mark("after gradient buckets"), Phase::None);
    }

    /// Stacks as PyTorch's snapshots record them (innermost first; the site-packages prefix
    /// kept as it comes).
    fn stack(frames: &[(&str, &str)]) -> Vec<Frame> {
        frames
            .iter()
            .map(|(file, function)| f(&format!("/venv/lib/python3.12/site-packages/{file}"), function))
            .collect()
    }

    #[test]
    fn phases_from_hugging_face_frames() {
        // From the shipped GPT-2 snapshot (transformers 5.17): the key/value cache written in
        // an attention forward, the optimizer's state made lazily in its first step and its
        // update, and the first allocation of backward on the main thread.
        let mut cache = stack(&[
            ("transformers/cache_utils.py", "update"),
            ("transformers/models/gpt2/modeling_gpt2.py", "forward"),
            ("torch/nn/modules/module.py", "_call_impl"),
            ("torch/nn/modules/module.py", "_wrapped_call_impl"),
            ("transformers/modeling_layers.py", "__call__"),
            ("transformers/models/gpt2/modeling_gpt2.py", "forward"),
            ("transformers/utils/generic.py", "wrapper"),
        ]);
        cache.push(f("workloads.py", "gpt2_train"));
        assert_eq!(phase_of_frames(&cache), Some(Phase::Forward));
        // A model's forward called without going through a module's `__call__` (cut stacks, or
        // a `forward` called directly): the modeling file alone says it.
        let direct = stack(&[
            ("transformers/integrations/sdpa_attention.py", "sdpa_attention_forward"),
            ("transformers/models/gpt2/modeling_gpt2.py", "forward"),
        ]);
        assert_eq!(phase_of_frames(&direct), Some(Phase::Forward));
        let state = stack(&[
            ("torch/optim/adam.py", "_init_group"),
            ("torch/optim/adam.py", "step"),
            ("torch/optim/optimizer.py", "_use_grad"),
            ("torch/optim/optimizer.py", "wrapper"),
        ]);
        assert_eq!(phase_of_frames(&state), Some(Phase::Optimizer));
        let make_grads = stack(&[
            ("torch/autograd/__init__.py", "_make_grads"),
            ("torch/autograd/__init__.py", "backward"),
            ("torch/_tensor.py", "backward"),
        ]);
        assert_eq!(phase_of_frames(&make_grads), Some(Phase::Backward));
        // The Trainer: backward through accelerate, gradient clipping, the step through the
        // learning-rate scheduler's wrapper, and `zero_grad` (no step, no forward).
        let trainer_backward = stack(&[
            ("torch/autograd/graph.py", "_engine_run_backward"),
            ("torch/autograd/__init__.py", "backward"),
            ("torch/_tensor.py", "backward"),
            ("accelerate/accelerator.py", "backward"),
            ("transformers/trainer.py", "training_step"),
            ("transformers/trainer.py", "_inner_training_loop"),
        ]);
        assert_eq!(phase_of_frames(&trainer_backward), Some(Phase::Backward));
        let clip = stack(&[
            ("torch/nn/utils/clip_grad.py", "_get_total_norm"),
            ("accelerate/accelerator.py", "clip_grad_norm_"),
            ("transformers/trainer.py", "_inner_training_loop"),
        ]);
        assert_eq!(phase_of_frames(&clip), Some(Phase::Optimizer));
        let step = stack(&[
            ("torch/optim/adamw.py", "_multi_tensor_adamw"),
            ("torch/optim/adamw.py", "adamw"),
            ("torch/optim/adamw.py", "step"),
            ("torch/optim/optimizer.py", "wrapper"),
            ("torch/optim/lr_scheduler.py", "wrapper"),
            ("accelerate/optimizer.py", "step"),
            ("transformers/trainer.py", "_inner_training_loop"),
        ]);
        assert_eq!(phase_of_frames(&step), Some(Phase::Optimizer));
        let zero =
            stack(&[("torch/optim/optimizer.py", "zero_grad"), ("transformers/trainer.py", "_inner_training_loop")]);
        assert_eq!(phase_of_frames(&zero), Some(Phase::None));
        // Loading the weights is not a forward, though the file is `modeling_utils.py`.
        let load = stack(&[("transformers/modeling_utils.py", "to"), ("torch/nn/modules/module.py", "_apply")]);
        assert_eq!(phase_of_frames(&load), Some(Phase::None));
    }

    #[test]
    fn phases_from_vision_and_lightning_frames() {
        let timm = stack(&[
            ("timm/layers/mlp.py", "forward"),
            ("timm/models/vision_transformer.py", "forward_features"),
            ("timm/models/vision_transformer.py", "forward"),
        ]);
        assert_eq!(phase_of_frames(&timm), Some(Phase::Forward));
        let resnet = stack(&[
            ("torch/nn/functional.py", "batch_norm"),
            ("torch/nn/modules/batchnorm.py", "forward"),
            ("torch/nn/modules/module.py", "_call_impl"),
            ("torchvision/models/resnet.py", "_forward_impl"),
            ("torchvision/models/resnet.py", "forward"),
        ]);
        assert_eq!(phase_of_frames(&resnet), Some(Phase::Forward));
        // torchvision's transforms are modules, but they prepare the data: no forward.
        let augment = stack(&[
            ("torchvision/transforms/v2/functional/_geometry.py", "resize_image"),
            ("torchvision/transforms/v2/_transform.py", "forward"),
            ("torch/nn/modules/module.py", "_call_impl"),
            ("torch/nn/modules/module.py", "_wrapped_call_impl"),
        ]);
        assert_eq!(phase_of_frames(&augment), Some(Phase::None));
        // Lightning runs the forward and the backward inside `optimizer.step(closure)`: the
        // innermost frame that tells decides, and backward wherever it is.
        let outer = [
            ("lightning/pytorch/loops/optimization/automatic.py", "closure"),
            ("torch/optim/optimizer.py", "_use_grad"),
            ("torch/optim/adamw.py", "step"),
            ("torch/optim/optimizer.py", "wrapper"),
            ("lightning/pytorch/core/optimizer.py", "step"),
            ("lightning/pytorch/loops/optimization/automatic.py", "run"),
        ];
        let mut forward =
            vec![("train.py", "training_step"), ("lightning/pytorch/strategies/strategy.py", "training_step")];
        forward.extend(outer);
        let mut forward = stack(&forward);
        forward[0] = f("train.py", "training_step");
        assert_eq!(phase_of_frames(&forward), Some(Phase::Forward));
        let mut backward = vec![
            ("torch/autograd/__init__.py", "backward"),
            ("torch/_tensor.py", "backward"),
            ("lightning/pytorch/core/module.py", "backward"),
        ];
        backward.extend(outer);
        assert_eq!(phase_of_frames(&stack(&backward)), Some(Phase::Backward));
        assert_eq!(phase_of_frames(&stack(&outer[1..])), Some(Phase::Optimizer));
    }

    #[test]
    fn phases_from_autograd_functions_and_cpp_frames() {
        // A custom autograd function in a forward: `apply` with the model's frames outside it.
        let forward = stack(&[
            ("flash_attn/flash_attn_interface.py", "forward"),
            ("torch/autograd/function.py", "apply"),
            ("transformers/models/llama/modeling_llama.py", "forward"),
            ("torch/nn/modules/module.py", "_call_impl"),
        ]);
        assert_eq!(phase_of_frames(&forward), Some(Phase::Forward));
        // Its backward, called by the engine on its own thread: `apply` is the outermost frame.
        let backward =
            stack(&[("flash_attn/flash_attn_interface.py", "backward"), ("torch/autograd/function.py", "apply")]);
        assert_eq!(phase_of_frames(&backward), Some(Phase::Backward));
        // A forward under `@torch.no_grad()` (its decorator lives in `torch/autograd/` in older
        // PyTorch) is no backward.
        let no_grad = stack(&[
            ("torch/nn/modules/linear.py", "forward"),
            ("torch/nn/modules/module.py", "_call_impl"),
            ("torch/autograd/grad_mode.py", "decorate_context"),
        ]);
        assert_eq!(phase_of_frames(&no_grad), Some(Phase::Forward));
        // Activation checkpointing recomputing a layer's forward in backward.
        let recompute = stack(&[
            ("torch/nn/modules/linear.py", "forward"),
            ("torch/nn/modules/module.py", "_call_impl"),
            ("torch/utils/checkpoint.py", "recompute_fn"),
            ("torch/utils/checkpoint.py", "unpack_hook"),
        ]);
        assert_eq!(phase_of_frames(&recompute), Some(Phase::Backward));
        // With C++ frames (`stacks="all"`): autograd's thread, and a foreach optimizer kernel.
        let engine = [
            f("??", "at::native::empty_cuda(...)"),
            f("??", "torch::autograd::generated::MmBackward0::apply(...)"),
            f("??", "torch::autograd::Engine::evaluate_function(...)"),
            f("??", "torch::autograd::Engine::thread_main(...)"),
        ];
        assert_eq!(phase_of_frames(&engine), Some(Phase::Backward));
        let foreach = [
            f("??", "at::native::foreach_tensor_mul_scalar_kernel_cuda(...)"),
            f("??", "at::_ops::_foreach_mul_Scalar::call(...)"),
        ];
        assert_eq!(phase_of_frames(&foreach), Some(Phase::Optimizer));
        // A fused kernel of a forward is no optimizer step.
        let dropout = [
            f("??", "at::_ops::_fused_dropout::call(...)"),
            f("/venv/lib/python3.12/site-packages/torch/nn/functional.py", "dropout"),
        ];
        assert_eq!(phase_of_frames(&dropout), Some(Phase::Forward));
    }

    /// A training program seen through its frames only (no marks), two iterations, whose
    /// trace ends in an out-of-memory error at `cut`.
    /// * parameters 2 x 10 MiB (before the first forward);
    /// * forward: four activations of 8 MiB and an output of 2 MiB (kept until the next forward);
    /// * backward: a 1 MiB temporary, then for each activation freed in reverse order, a gradient
    ///   of 10 MiB made for the first two (autograd's thread: no frames);
    /// * the step: AdamW's state, 4 x 10 MiB in the first step only; `zero_grad` frees the
    ///   gradients before the next forward.
    fn program_with_frames(cut: Cut) -> Trace {
        use recorder::trace::{Header, Pool, Record, Source};
        const MIB: u64 = 1 << 20;
        let lib = "/venv/lib/python3.12/site-packages/torch";
        let mut ev: Vec<Event> = vec![
            Event::CallSite { id: 1, frames: vec![f("train.py", "main")] },
            Event::CallSite {
                id: 2,
                frames: vec![f(&format!("{lib}/nn/modules/linear.py"), "forward"), f("train.py", "main")],
            },
            Event::CallSite {
                id: 3,
                frames: vec![f(&format!("{lib}/autograd/__init__.py"), "_make_grads"), f("train.py", "main")],
            },
            Event::CallSite {
                id: 4,
                frames: vec![f(&format!("{lib}/optim/adamw.py"), "_init_group"), f("train.py", "main")],
            },
        ];
        let mut next = 0u64;
        let mut alloc = |ev: &mut Vec<Event>, bytes: u64, callsite: u32| {
            next += 1;
            ev.push(Event::Alloc {
                id: next,
                addr: next << 32,
                requested_bytes: bytes,
                block_bytes: bytes,
                stream: 0,
                pool: Pool::Large,
                callsite,
            });
            next
        };
        let free = |ev: &mut Vec<Event>, id: u64| {
            ev.push(Event::FreeRequested { id, addr: id << 32, callsite: 0 });
            ev.push(Event::FreeCompleted { id, addr: id << 32 });
        };
        let oom = |ev: &mut Vec<Event>| {
            ev.push(Event::Oom {
                requested_bytes: 64 * MIB,
                alloc_bytes: 64 * MIB,
                device_free_bytes: 0,
                reserved_bytes: 0,
                allocated_bytes: 0,
                limit_bytes: 0,
                stream: 0,
            })
        };
        alloc(&mut ev, 10 * MIB, 1);
        alloc(&mut ev, 10 * MIB, 1);
        let (mut grads, mut output): (Vec<u64>, Option<u64>) = (Vec::new(), None);
        'steps: for step in 0..2 {
            for g in grads.drain(..) {
                free(&mut ev, g);
            }
            let acts: Vec<u64> = (0..4).map(|_| alloc(&mut ev, 8 * MIB, 2)).collect();
            if let Some(o) = output.take() {
                free(&mut ev, o);
            }
            if cut == Cut::Forward && step == 1 {
                oom(&mut ev);
                break 'steps;
            }
            output = Some(alloc(&mut ev, 2 * MIB, 2));
            let t = alloc(&mut ev, MIB, 3);
            free(&mut ev, t);
            for (k, a) in acts.iter().rev().enumerate() {
                if k < 2 {
                    grads.push(alloc(&mut ev, 10 * MIB, 0));
                }
                if cut == Cut::Backward && step == 0 && k == 1 {
                    oom(&mut ev);
                    break 'steps;
                }
                free(&mut ev, *a);
            }
            if step == 0 {
                for _ in 0..4 {
                    alloc(&mut ev, 10 * MIB, 4);
                }
            }
        }
        let records = ev.into_iter().enumerate().map(|(i, event)| Record { time_ns: i as u64, event }).collect();
        Trace::from_records(std::path::Path::new("frames.atrace"), Header::new(Source::Recorded), records)
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Cut {
        Forward,
        Backward,
        None,
    }

    #[test]
    fn what_an_out_of_memory_error_cuts_short_is_unknown() {
        const MIB: u64 = 1 << 20;
        // Cut in the second forward, after its four activations: the first iteration is told
        // (parameters 20, gradients 20, state 40, activations 32 at most, its output 2 an
        // "other" kept past its backward and freed in the next forward), the second forward's
        // 32 MiB is unknown: activations, or outputs the program keeps, only its backward
        // would have told.
        let t = program_with_frames(Cut::Forward);
        let c = analyze(&t).unwrap().unwrap();
        assert_eq!(c.phases_from, "frames");
        assert_eq!(c.forward_passes, 2);
        assert_eq!(c.max.parameter, 20 * MIB);
        assert_eq!(c.max.gradient, 20 * MIB);
        assert_eq!(c.max.optimizer_state, 40 * MIB);
        assert_eq!(c.max.activation, 32 * MIB);
        assert_eq!(c.max.temporary, MIB);
        assert_eq!(c.max.other, 2 * MIB);
        assert_eq!(c.max.unknown, 32 * MIB);
        // The peak: the second forward's four activations with the parameters, the state and
        // the first output (20 + 40 + 32 + 2 = 94, before that output is freed).
        assert_eq!(
            c.at_peak,
            ByCategory {
                parameter: 20 * MIB,
                optimizer_state: 40 * MIB,
                other: 2 * MIB,
                unknown: 32 * MIB,
                ..Default::default()
            }
        );
        assert!(c.checkpointing.is_none(), "no estimate on bytes of unknown category");
        // At the out-of-memory error (the last event): the same less the freed output.
        let m = analyze_at(&t, Some(t.events - 1)).unwrap().unwrap();
        assert_eq!(m.at_moment.unwrap().bytes.unknown, 32 * MIB);
        assert_eq!(m.at_moment.unwrap().bytes.activation, 0);
        assert!(m.checkpointing.is_none());

        // Cut in the first backward, once its second gradient is made: the one activation it
        // freed is an activation; the three still held, the output and both gradients are
        // unknown (24 + 2 + 20); the parameters are told by the forward that followed them.
        let t = program_with_frames(Cut::Backward);
        let c = analyze(&t).unwrap().unwrap();
        assert_eq!(c.max.parameter, 20 * MIB);
        assert_eq!(c.max.activation, 8 * MIB);
        assert_eq!(c.max.temporary, MIB);
        assert_eq!(c.max.gradient, 0);
        assert_eq!(c.max.optimizer_state, 0);
        assert_eq!(c.max.unknown, 46 * MIB);
        assert!(c.checkpointing.is_none());

        // The same program run to the end is told whole, with its estimate: the second
        // iteration's activations are activations, its gradients gradients, its output other.
        let c = analyze(&program_with_frames(Cut::None)).unwrap().unwrap();
        assert_eq!(c.max.unknown, 0);
        assert_eq!(c.max.activation, 32 * MIB);
        assert_eq!(c.max.gradient, 20 * MIB);
        assert_eq!(c.max.other, 2 * MIB);
        assert!(c.checkpointing.is_some());
    }

    /// A program as the recording shim marks it: parameters before the first forward, two
    /// iterations of forward (activations), backward (gradients made, activations freed) and
    /// an optimizer step (its state made in the first step), `zero_grad` freeing the gradients.
    fn marked_program(ddp: bool) -> Trace {
        use recorder::trace::{Header, Pool, Record, Source};
        const MIB: u64 = 1 << 20;
        let mut recs: Vec<Event> = Vec::new();
        let mut next = 0u64;
        let mut alloc = |recs: &mut Vec<Event>, bytes: u64| {
            next += 1;
            recs.push(Event::Alloc {
                id: next,
                addr: next << 32,
                requested_bytes: bytes,
                block_bytes: bytes,
                stream: 0,
                pool: Pool::Large,
                callsite: 0,
            });
            next
        };
        let free = |recs: &mut Vec<Event>, id: u64| {
            recs.push(Event::FreeRequested { id, addr: id << 32, callsite: 0 });
            recs.push(Event::FreeCompleted { id, addr: id << 32 });
        };
        let mark = |recs: &mut Vec<Event>, t: &str| recs.push(Event::Mark { kind: MarkKind::Phase, text: t.into() });
        let params = [alloc(&mut recs, 10 * MIB), alloc(&mut recs, 10 * MIB)];
        if ddp {
            // DistributedDataParallel's construction: the parameters broadcast through a flat
            // buffer (freed there), and a gradient bucket as large as the parameters (kept).
            mark(&mut recs, "gradient buckets (DistributedDataParallel)");
            let flat = alloc(&mut recs, 20 * MIB);
            free(&mut recs, flat);
            alloc(&mut recs, 20 * MIB);
            mark(&mut recs, "after gradient buckets");
        }
        let mut grads: Vec<u64> = Vec::new();
        for step in 0..2 {
            for g in grads.drain(..) {
                free(&mut recs, g); // zero_grad(set_to_none=True)
            }
            mark(&mut recs, "forward");
            // Four activations of 8 MiB and a temporary freed within the forward.
            let acts: Vec<u64> = (0..4).map(|_| alloc(&mut recs, 8 * MIB)).collect();
            let t = alloc(&mut recs, MIB);
            free(&mut recs, t);
            mark(&mut recs, "after forward");
            mark(&mut recs, "backward");
            // Backward frees the activations in reverse order and makes the gradients.
            for (k, a) in acts.iter().rev().enumerate() {
                if k < 2 {
                    grads.push(alloc(&mut recs, 10 * MIB));
                }
                free(&mut recs, *a);
            }
            mark(&mut recs, "after backward");
            mark(&mut recs, "optimizer step");
            if step == 0 {
                for _ in 0..4 {
                    alloc(&mut recs, 10 * MIB);
                }
            }
            mark(&mut recs, "after optimizer step");
        }
        let _ = params;
        let records = recs.into_iter().enumerate().map(|(i, event)| Record { time_ns: i as u64, event }).collect();
        Trace::from_records(std::path::Path::new("marked.atrace"), Header::new(Source::Recorded), records)
    }

    #[test]
    fn shares_largest_first() {
        let b = ByCategory { activation: 610, optimizer_state: 220, parameter: 167, other: 3, ..Default::default() };
        assert_eq!(b.shares_text(), "activations 61%, optimizer state 22%, parameters 17%, other under 1%");
        assert_eq!(ByCategory::default().shares_text(), "");
        let failing = ByCategory { unknown: 85, optimizer_state: 15, ..Default::default() };
        assert_eq!(failing.shares_text(), "the failing step's 85%, optimizer state 15%");
    }

    #[test]
    fn categories_from_phase_marks() {
        const MIB: u64 = 1 << 20;
        let c = analyze(&marked_program(false)).unwrap().expect("phase marks give categories");
        assert_eq!(c.phases_from, "phase marks");
        assert_eq!(c.forward_passes, 2);
        assert_eq!(c.max.parameter, 20 * MIB);
        assert_eq!(c.max.gradient, 20 * MIB);
        assert_eq!(c.max.optimizer_state, 40 * MIB);
        assert_eq!(c.max.activation, 32 * MIB);
        assert_eq!(c.max.temporary, MIB);
        assert_eq!(c.max.other, 0);
        // The peak: the second iteration's second gradient (parameters 20 + state 40 + three
        // activations 24 + two gradients 20).
        assert_eq!(c.at_peak.total(), 104 * MIB);
        assert_eq!(c.at_peak.activation, 24 * MIB);
        assert_eq!(c.at_peak.shares_text(), "optimizer state 38%, activations 23%, parameters 19%, gradients 19%");
        let k = c.checkpointing.expect("activations give an estimate");
        assert_eq!(k.activation_bytes_at_peak, 24 * MIB);
        // Four blocks of one activation each: one is live at a time in the forward; in backward
        // the last is recomputed when backward begins (60 + 8 + the first gradient 10), the one
        // before it once the last is freed: 60 + 8 + two gradients = 88.
        let four = k.blocks.iter().find(|r| r.blocks == 4).unwrap();
        assert_eq!(four.peak_bytes, 88 * MIB);
        // Two blocks of two: the first block recomputed once the second is freed, with both
        // gradients live: 60 + 16 + 20 = 96.
        let two = k.blocks.iter().find(|r| r.blocks == 2).unwrap();
        assert_eq!(two.peak_bytes, 96 * MIB);
        // At a moment: after the second forward's last activation.
        let m = analyze_at(&marked_program(false), Some(c.peak_event)).unwrap().unwrap().at_moment.unwrap();
        assert_eq!(m.bytes, c.at_peak);
    }

    #[test]
    fn what_distributed_data_parallel_keeps_is_gradient() {
        const MIB: u64 = 1 << 20;
        let c = analyze(&marked_program(true)).unwrap().unwrap();
        // The bucket is a gradient, not a parameter (both made before the first forward and
        // kept); the broadcast buffer a temporary.
        assert_eq!(c.max.parameter, 20 * MIB);
        assert_eq!(c.max.gradient, 40 * MIB);
        assert_eq!(c.allocations.gradient, 4 + 1);
        assert_eq!(c.allocations.temporary, 2 + 1);
        assert_eq!(c.at_peak.total(), 124 * MIB);
    }

    #[test]
    fn an_empty_phase_is_replaced_by_the_next() {
        use recorder::trace::{Header, Pool, Record, Source};
        let alloc = |id: u64, bytes: u64| Event::Alloc {
            id,
            addr: id << 32,
            requested_bytes: bytes,
            block_bytes: bytes,
            stream: 0,
            pool: Pool::Large,
            callsite: 0,
        };
        let mark = |t: &str| Event::Mark { kind: MarkKind::Phase, text: t.into() };
        let free = |id: u64| Event::FreeCompleted { id, addr: id << 32 };
        // Each forward begins with DistributedDataParallel's bucket rebuild, marked inside it.
        let mut ev = vec![alloc(1, 1024)];
        for k in 0..2u64 {
            ev.extend([mark("forward"), mark("gradient buckets (DistributedDataParallel)")]);
            if k == 0 {
                ev.push(alloc(2, 4096)); // the rebuilt bucket, kept
            }
            ev.extend([mark("forward"), alloc(10 + k, 512), mark("after forward"), mark("backward"), free(10 + k)]);
            ev.push(mark("after backward"));
        }
        let records = ev.into_iter().enumerate().map(|(i, event)| Record { time_ns: i as u64, event }).collect();
        let t = Trace::from_records(std::path::Path::new("ddp.atrace"), Header::new(Source::Recorded), records);
        let c = analyze(&t).unwrap().unwrap();
        assert_eq!(c.forward_passes, 2);
        assert_eq!(c.max.parameter, 1024);
        assert_eq!(c.max.gradient, 4096);
        assert_eq!(c.max.activation, 512);
    }
}
