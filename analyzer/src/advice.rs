//! Allocator settings advised for a run that ran out of memory, weighed on what a replay can
//! know ([`crate::outcome`]).
//!
//! A setting is advised only when its replay at the same limit gets past the request that
//! failed *and* the whole job, predicted by repeating the last whole iteration, fits under it.
//! A setting that only gets past the failed request, with the rest of the job unknown, is
//! named as such and not advised; so is one predicted to run out of memory later. The capacity
//! to give the process is the one the predicted job needs, never the smallest capacity at which
//! a prefix of the job gets past its failure.

use crate::explain::Advice;
use crate::outcome::{JobPrediction, Reach};
use crate::units::fmt_bytes;
use crate::whatif::PolicyRow;

/// Appends the setting and capacity advice for a trace that ends in an OOM.
pub fn settings_at_oom(
    rows: &[PolicyRow],
    prediction: Option<&JobPrediction>,
    cap_text: &str,
    advice: &mut Vec<Advice>,
    not_advised: &mut Vec<String>,
    fragmentation: bool,
) {
    let b = fmt_bytes;
    let basis = prediction.map(|p| p.basis()).unwrap_or_default();
    let mut past: Vec<&PolicyRow> = rows.iter().filter(|r| !r.policy.is_recorded() && r.reach.gets_past()).collect();
    past.sort_by_key(|r| r.peak_reserved_bytes);
    let mut advised = 0;
    for r in &past {
        let predicted = prediction.and_then(|p| p.of(&r.policy));
        match predicted {
            Some(p) if p.fits => {
                advised += 1;
                advice.push(Advice {
                    kind: "setting",
                    setting: Some(format!("PYTORCH_CUDA_ALLOC_CONF={}", r.alloc_conf)),
                    text: format!("set PYTORCH_CUDA_ALLOC_CONF={}", r.alloc_conf),
                    evidence: format!(
                        "at {cap_text} its replay gets past the request that failed (peak reserved {}, {} device calls), \
where the recorded settings fail; the whole job is predicted to fit ({basis}){}",
                        b(r.peak_reserved_bytes),
                        r.num_device_alloc + r.num_device_free,
                        p.needs_bytes.map(|n| format!("; it needs about {}", b(n))).unwrap_or_default()
                    ),
                });
            }
            Some(p) => not_advised.push(format!(
                "{}: its replay gets past the request that failed at {cap_text}, but the whole job is predicted to run out \
of memory later{} ({basis})",
                r.policy,
                p.needs_bytes.map(|n| format!(" (it needs about {})", b(n))).unwrap_or_default()
            )),
            None => not_advised.push(format!(
                "{}: its replay gets past the request that failed at {cap_text}; {}",
                r.policy,
                match prediction {
                    Some(p) => p.basis(),
                    None => "the rest of the job is not in the trace".into(),
                }
            )),
        }
    }
    for r in rows.iter().filter(|r| !r.policy.is_recorded() && !r.reach.gets_past()) {
        let expandable = r.policy.name().starts_with("expandable_segments:True");
        if expandable || fragmentation {
            let suggested = if expandable {
                " (PyTorch's message suggests it when reserved-but-unallocated memory is large)"
            } else {
                ""
            };
            let how = match r.reach {
                Reach::FailsEarlier => "fails earlier",
                Reach::CannotTell => {
                    "runs out of memory at a request the recorded run served and the program may have caught (a \
cuDNN workspace, or a program that catches OOMs), so the trace cannot tell how far it gets"
                }
                _ => "also fails there",
            };
            not_advised.push(format!(
                "{}{suggested}: its replay {how} at {cap_text}{}",
                r.policy,
                r.min_capacity_bytes.map(|m| format!(" (it gets past the failure from {})", b(m))).unwrap_or_default()
            ));
        }
    }
    if advised > 0 {
        return;
    }
    if !matches!(prediction, Some(JobPrediction::FromRepeatedIteration { .. })) {
        // No prediction: only how much gets the program past the request that failed.
        let recorded = rows.iter().find(|r| r.policy.is_recorded()).and_then(|r| r.min_capacity_bytes);
        if let Some(rec) = recorded {
            advice.push(Advice {
                kind: "capacity",
                setting: None,
                text: format!(
                    "with more memory than {cap_text}: from {} the program gets past the request that failed; whether the \
rest of the job fits is not in the trace",
                    b(rec)
                ),
                evidence: format!(
                    "the smallest capacity at which the replay gets past the failed request: {} under the recorded \
settings; {basis}",
                    b(rec)
                ),
            });
        }
        return;
    }
    // The capacity to give: what the predicted whole job needs.
    if let Some(JobPrediction::FromRepeatedIteration { policies, .. }) = prediction {
        let recorded = policies.iter().find(|p| p.policy.is_recorded()).and_then(|p| p.needs_bytes);
        let best = policies.iter().filter_map(|p| p.needs_bytes.map(|n| (n, p))).min_by_key(|(n, _)| *n);
        if let (Some(rec), Some((best_n, best_p))) = (recorded, best) {
            let row = rows.iter().find(|r| r.policy == best_p.policy);
            let setting = (!best_p.policy.is_recorded() && (best_n as f64) < 0.9 * rec as f64)
                .then(|| row.map(|r| format!("PYTORCH_CUDA_ALLOC_CONF={}", r.alloc_conf)))
                .flatten();
            advice.push(Advice {
                kind: "capacity",
                setting: setting.clone(),
                text: match &setting {
                    Some(s) => format!("the whole job is predicted to need about {} of memory with {s}", b(best_n)),
                    None => format!(
                        "the whole job is predicted to need about {} of memory (no setting fits it at {cap_text})",
                        b(rec)
                    ),
                },
                evidence: format!(
                    "{basis}: about {} under the recorded settings{}; a prediction from the repeated iteration, not a \
replay of the job",
                    b(rec),
                    if best_p.policy.is_recorded() {
                        String::new()
                    } else {
                        format!(", {} under {}", b(best_n), best_p.policy)
                    }
                ),
            });
        }
    }
}
