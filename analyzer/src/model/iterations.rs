//! Iterations: the one rule by which every analysis finds them (leaks' growth per iteration, the
//! alignment of ranks), from what the trace marks.
//!
//! 1. `iteration` marks (`alloctrace.mark_iteration()`), when there are at least two.
//! 2. Else a repeated annotation (a `record_function` range of PyTorch's, a phase the recorder's
//!    hook marks), trailing `#N` step numbers ignored (`ProfilerStep#3`). A name that says it runs
//!    once an iteration (one containing `iteration`, `ProfilerStep`, PyTorch's
//!    `Optimizer.zero_grad#...` and `Optimizer.step#...`, the hook's `optimizer step` phase)
//!    counts from two repeats (a snapshot taken at an OOM in the second step holds two); any
//!    other from [`MIN_REPEATS`]. A range's `START` marks come first (a name ending ` START`,
//!    where any repeats); among those, names in the order above, then the annotation that comes
//!    first in the trace, then the one that repeats more (the most frequent is not the
//!    iteration: a phase marked twice a step, as `forward` is when DDP's first bucket rebuild
//!    splits it, would double the count).
//! 3. Else none.
//!
//! The trace's fold ([`crate::model::Facts::iterations`]) sees every mark once, when the trace
//! is read; [`IterationFold::iterations_before`] applies the rule to the marks before an event
//! (the whole-job prediction's, up to the OOM that ended the job). `leaks` needs three
//! iterations to measure growth: with fewer from annotations it looks for the period of the
//! request stream.

use recorder::trace::{Event, MarkKind};
use std::collections::BTreeMap;

/// An annotation is taken for an iteration boundary when it repeats at least this many times;
/// a name that says it is run once an iteration ([`IterationFold::iterations_before`]), from
/// [`MIN_NAMED_REPEATS`].
pub const MIN_REPEATS: usize = 3;
pub const MIN_NAMED_REPEATS: usize = 2;
/// Distinct annotation names kept (a trace of unique names would otherwise keep them all).
const MAX_NAMES: usize = 4096;

/// Where a trace's iterations come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IterationSource {
    Marks,
    /// The (normalized) annotation.
    Annotation(String),
}

impl std::fmt::Display for IterationSource {
    /// How every command names where the iterations came from.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IterationSource::Marks => write!(f, "iteration marks"),
            IterationSource::Annotation(t) => write!(f, "the annotation \"{t}\""),
        }
    }
}

/// The iterations of a trace: the event index at which each starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iterations {
    pub source: IterationSource,
    pub starts: Vec<u64>,
}

/// The fold that finds them, fed every record of a pass ([`IterationFold::observe`]).
#[derive(Debug, Clone, Default)]
pub struct IterationFold {
    marks: Vec<u64>,
    annotations: BTreeMap<String, Vec<u64>>,
}

impl IterationFold {
    pub fn observe(&mut self, i: u64, event: &Event) {
        match event {
            Event::Mark { kind: MarkKind::Iteration, .. } => self.marks.push(i),
            Event::Mark { kind: MarkKind::Annotation | MarkKind::Phase, text } => {
                let t = normalized(text);
                if let Some(v) = self.annotations.get_mut(&t) {
                    v.push(i);
                } else if self.annotations.len() < MAX_NAMES {
                    self.annotations.insert(t, vec![i]);
                }
            }
            _ => {}
        }
    }

    /// The iterations, by the rule of the module documentation.
    pub fn iterations(&self) -> Option<Iterations> {
        self.iterations_before(u64::MAX)
    }

    /// The iterations of the trace's records before event `before` (those up to an OOM that
    /// ended the job), by the same rule: as if the fold had seen only those records.
    pub fn iterations_before(&self, before: u64) -> Option<Iterations> {
        let cut = |v: &[u64]| -> Vec<u64> { v[..v.partition_point(|&i| i < before)].to_vec() };
        let marks = cut(&self.marks);
        if marks.len() >= 2 {
            return Some(Iterations { source: IterationSource::Marks, starts: marks });
        }
        let preferred = |t: &str| {
            let l = t.to_ascii_lowercase();
            if l.contains("iteration") {
                0
            } else if l.starts_with("profilerstep") {
                1
            } else if l.starts_with("optimizer.zero_grad") {
                2
            } else if l.starts_with("optimizer.step") || l == "optimizer step" {
                3
            } else {
                4
            }
        };
        let annotations: Vec<(&String, Vec<u64>)> = self
            .annotations
            .iter()
            .map(|(t, v)| (t, cut(v)))
            .filter(|(t, v)| v.len() >= if preferred(t) < 4 { MIN_NAMED_REPEATS } else { MIN_REPEATS })
            .collect();
        let repeated = |start_only: bool| {
            annotations
                .iter()
                .filter(|(t, _)| !start_only || t.ends_with(" START"))
                .min_by_key(|(t, v)| (preferred(t), v[0], std::cmp::Reverse(v.len()), (*t).clone()))
                .map(|(t, v)| Iterations { source: IterationSource::Annotation((*t).clone()), starts: v.clone() })
        };
        repeated(true).or_else(|| repeated(false))
    }
}

/// `record_function` names carry step numbers (`ProfilerStep#3`): dropped, so that they repeat.
pub fn normalized(text: &str) -> String {
    match text.find('#') {
        Some(p) => {
            let (head, tail) = text.split_at(p);
            let rest = tail[1..].trim_start_matches(|c: char| c.is_ascii_digit());
            if rest.len() + 1 == tail.len() {
                text.to_string()
            } else {
                format!("{head}{rest}")
            }
        }
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(marks: &[u64], annotations: &[(&str, &[u64])]) -> IterationFold {
        let mut events: Vec<(u64, Event)> =
            marks.iter().map(|&i| (i, Event::Mark { kind: MarkKind::Iteration, text: String::new() })).collect();
        for (t, at) in annotations {
            events.extend(at.iter().map(|&i| (i, Event::Mark { kind: MarkKind::Annotation, text: t.to_string() })));
        }
        events.sort_by_key(|e| e.0);
        let mut f = IterationFold::default();
        for (i, e) in &events {
            f.observe(*i, e);
        }
        f
    }

    #[test]
    fn marks_then_the_annotation_that_says_iteration() {
        let ann: &[(&str, &[u64])] = &[
            ("iteration START", &[5, 50, 95]),
            ("Optimizer.step#SGD.step START", &[40, 90, 130]),
            ("once START", &[1]),
            ("gloo:broadcast START", &[2, 45, 95, 140]),
        ];
        let it = fold(&[], ann).iterations().unwrap();
        assert_eq!(it.source, IterationSource::Annotation("iteration START".into()));
        assert_eq!(it.starts, [5, 50, 95]);
        assert_eq!(fold(&[3, 60], ann).iterations().unwrap().source, IterationSource::Marks);
        // One mark is not iterations; two repeats of a name are not a loop.
        assert_eq!(fold(&[3], ann).iterations().unwrap().source, IterationSource::Annotation("iteration START".into()));
        assert_eq!(fold(&[3], &[("a", &[1, 2])]).iterations(), None);
        assert_eq!(normalized("ProfilerStep#12 START"), "ProfilerStep START");
        assert_eq!(normalized("Optimizer.step#AdamW.step START"), "Optimizer.step#AdamW.step START");
        let steps = fold(&[], &[("ProfilerStep#1", &[3]), ("ProfilerStep#2", &[30]), ("ProfilerStep#3", &[60])]);
        assert_eq!(steps.iterations().unwrap().starts, [3, 30, 60]);
    }

    /// DDP's first bucket rebuild splits the first `forward` of every step in two (the
    /// recorder's phase marks on the two-GPU fixture: `forward` 16 times in 8 steps): the
    /// optimizer step, once a step, is the iteration.
    #[test]
    fn a_phase_marked_twice_a_step_does_not_double_the_iterations() {
        let forward: Vec<u64> = (0..8).flat_map(|k| [100 * k + 1, 100 * k + 3]).collect();
        let buckets: Vec<u64> = std::iter::once(0).chain((0..8).map(|k| 100 * k + 2)).collect();
        let step: Vec<u64> = (0..8).map(|k| 100 * k + 50).collect();
        let mut f = IterationFold::default();
        let mut events: Vec<(u64, &str)> = forward.iter().map(|&i| (i, "forward")).collect();
        events.extend(buckets.iter().map(|&i| (i, "gradient buckets (DistributedDataParallel)")));
        events.extend(step.iter().map(|&i| (i, "optimizer step")));
        events.sort();
        for (i, t) in events {
            f.observe(i, &Event::Mark { kind: MarkKind::Phase, text: t.into() });
        }
        let it = f.iterations().unwrap();
        assert_eq!(it.source, IterationSource::Annotation("optimizer step".into()));
        assert_eq!(it.starts, step);
    }
}
