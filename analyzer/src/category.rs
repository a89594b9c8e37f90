//! What the memory is for: each allocation gets a category (parameter, gradient, optimizer
//! state, activation, temporary, other) from the phase that allocated it and its lifetime.
//!
//! **Phases.** A trace with `phase` marks (`forward`, `backward`, `optimizer`...) gives them
//! directly. Otherwise they come from each allocation's frames (innermost first), the first
//! rule that matches:
//! * a frame in `torch/optim/`: the optimizer step;
//! * a frame in `torch/autograd/`, or `backward` in `torch/_tensor.py`: backward;
//! * `forward`, `_call_impl` or `_wrapped_call_impl` in `torch/nn/modules/`, or a frame in
//!   `torch/nn/functional.py`: forward;
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
//! * optimizer state: allocated in a step, freed after that step (or never);
//! * activation: allocated in forward, freed in the backward that follows;
//! * temporary: freed in the run that allocated it;
//! * other: the rest (the program's own tensors, a forward output kept past its backward, the
//!   cuBLAS workspace...).
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
}

pub const CATEGORIES: [Category; 6] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
    Category::Temporary,
    Category::Other,
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
        }
    }
}

/// A phase of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
    /// Frames that belong to none of the above.
    None,
}

/// The phase of an allocation from its frames (see the module documentation); `None` when there
/// are no frames.
pub fn phase_of_frames(frames: &[Frame]) -> Option<Phase> {
    if frames.is_empty() {
        return None;
    }
    let norm = |f: &Frame| f.file.replace('\\', "/");
    if frames.iter().any(|f| norm(f).contains("torch/optim/")) {
        return Some(Phase::Optimizer);
    }
    if frames.iter().any(|f| {
        let file = norm(f);
        file.contains("torch/autograd/") || (file.ends_with("torch/_tensor.py") && f.function == "backward")
    }) {
        return Some(Phase::Backward);
    }
    if frames.iter().any(|f| {
        let file = norm(f);
        (file.contains("torch/nn/modules/")
            && matches!(f.function.as_str(), "forward" | "_call_impl" | "_wrapped_call_impl"))
            || file.ends_with("torch/nn/functional.py")
    }) {
        return Some(Phase::Forward);
    }
    Some(Phase::None)
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
    } else {
        Phase::None
    }
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
        }
    }
    pub fn total(&self) -> u64 {
        CATEGORIES.iter().map(|&c| self.get(c)).sum()
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
    /// Live bytes by category at that peak (they add up to the peak of allocated bytes).
    pub at_peak: ByCategory,
    /// The most live bytes of each category at any moment (not at the same moment).
    pub max: ByCategory,
    /// Allocations per category.
    pub allocations: ByCategory,
    /// Over time, at most [`TIMELINE_COLUMNS`] samples: for each equal run of events, the live
    /// bytes by category when their total was highest in that run (a stacked timeline).
    pub over_time: Vec<CategorySample>,
}

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
    let mut sites: HashMap<u32, (Option<Phase>, bool)> = HashMap::new();
    let mut runs: Vec<Phase> = Vec::new();
    let mut allocs: Vec<Alloc> = Vec::new();
    let mut by_id: HashMap<u64, usize> = HashMap::new();
    let mut current: Option<Phase> = None;
    let mut marked = false;
    let mut any_frames = false;
    trace.scan(|i, r| match &r.event {
        Event::CallSite { id, frames } => {
            any_frames |= !frames.is_empty();
            sites.insert(*id, (phase_of_frames(frames), is_ddp_bucket(frames)));
        }
        Event::Mark { kind: MarkKind::Phase, text } => {
            marked = true;
            let p = phase_of_mark(text);
            if current != Some(p) {
                runs.push(p);
                current = Some(p);
            }
        }
        Event::Alloc { id, requested_bytes, block_bytes, callsite, .. } => {
            if !marked {
                if let Some(p) = sites.get(callsite).and_then(|s| s.0) {
                    if current != Some(p) {
                        runs.push(p);
                        current = Some(p);
                    }
                }
            }
            if runs.is_empty() {
                runs.push(Phase::None);
                current = Some(Phase::None);
            }
            let bytes =
                if *block_bytes > 0 { *block_bytes } else { requested_bytes.max(&1).div_ceil(512).saturating_mul(512) };
            by_id.insert(*id, allocs.len());
            let bucket = sites.get(callsite).is_some_and(|s| s.1);
            allocs.push(Alloc { bytes, alloc_event: i, run: runs.len() - 1, free_run: None, completed: None, bucket });
        }
        Event::FreeRequested { id, .. } => {
            if let Some(&k) = by_id.get(id) {
                allocs[k].free_run = Some(runs.len().saturating_sub(1));
            }
        }
        Event::FreeCompleted { id, .. } => {
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
    let categories: Vec<Category> = allocs
        .iter()
        .map(|a| {
            let freed_in = a.free_run;
            let same_run = freed_in == Some(a.run);
            match runs[a.run] {
                _ if a.bucket && !same_run => Category::Gradient,
                _ if a.run < first_forward => {
                    let alive = match (second_forward, freed_in) {
                        (_, None) => true,
                        (Some(s), Some(f)) => f >= s,
                        (None, Some(_)) => false,
                    };
                    if alive && first_forward != usize::MAX {
                        Category::Parameter
                    } else {
                        Category::Other
                    }
                }
                _ if same_run => Category::Temporary,
                Phase::Backward => {
                    // Alive until the next backward at most: the cuBLAS workspace of autograd's
                    // thread, made in the first backward and kept, is no gradient.
                    let next_backward = (a.run + 1..runs.len()).find(|&k| runs[k] == Phase::Backward);
                    match (freed_in, next_backward) {
                        (Some(f), Some(b)) if f <= b => Category::Gradient,
                        (Some(_), None) | (None, None) => Category::Gradient,
                        _ => Category::Other,
                    }
                }
                Phase::Optimizer => Category::OptimizerState,
                Phase::Forward => {
                    // Freed in the backward that follows this forward.
                    let next_backward = (a.run + 1..runs.len()).find(|&k| runs[k] == Phase::Backward);
                    let next_forward = (a.run + 1..runs.len()).find(|&k| runs[k] == Phase::Forward);
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
        deltas.push((a.alloc_event, a.bytes as i64, c));
        if let Some(e) = a.completed {
            deltas.push((e, -(a.bytes as i64), c));
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
    let mut k = 0;
    while k < deltas.len() {
        let e = deltas[k].0;
        while k < deltas.len() && deltas[k].0 == e {
            let (_, d, c) = deltas[k];
            let v = live.get_mut(c);
            *v = (*v as i64 + d).max(0) as u64;
            total += d;
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
    Ok(Some(Categories {
        phases_from: if marked { "phase marks" } else { "frames" },
        forward_passes: forwards.len(),
        peak_event,
        at_peak,
        max,
        allocations,
        over_time,
    }))
}

/// Above this many events, `summary` leaves categories out unless asked (`--categories`): they
/// take a second pass over the trace and memory per allocation, and `summary` is the fast look.
pub const SUMMARY_MAX_EVENTS: u64 = 2_000_000;

/// Categories for `summary`: computed when the summary saw call sites or marks (a second pass
/// over the trace) and the trace has at most [`SUMMARY_MAX_EVENTS`] events or `always`; else
/// `None`.
pub fn of_summary(path: &std::path::Path, s: &crate::summary::Summary, always: bool) -> Result<Option<Categories>> {
    let has = |k: &str| s.events_by_kind.get(k).copied().unwrap_or(0) > 0;
    if (!has("callsite") && !has("mark")) || (s.events > SUMMARY_MAX_EVENTS && !always) {
        return Ok(None);
    }
    analyze(&Trace::open(path)?)
}

/// The text block of `summary`: bytes by category at the peak, and each category's most.
pub fn write_text(out: &mut dyn std::io::Write, c: &Categories) -> Result<()> {
    use crate::units::fmt_bytes;
    let total = c.at_peak.total().max(1);
    writeln!(
        out,
        "by category  at the peak of allocated bytes (event {}; phases from {}, {} forward passes):",
        c.peak_event, c.phases_from, c.forward_passes
    )?;
    for cat in CATEGORIES {
        writeln!(
            out,
            "  {:<16} {:>12} {:>5.1}%   most {:>12}",
            cat.as_str(),
            fmt_bytes(c.at_peak.get(cat)),
            c.at_peak.get(cat) as f64 * 100.0 / total as f64,
            fmt_bytes(c.max.get(cat))
        )?;
    }
    Ok(())
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
    }
}
