//! Allocator settings advised for a run that ran out of memory at the capacity compared, rendered
//! from the one decision per setting ([`crate::analysis::outcome::Decision`]) that the what-if table made.
//!
//! - Where the whole job is in the trace (a complete run replayed at a smaller capacity, or a
//!   run recorded past its limit), a setting whose replay completes at the capacity is advised,
//!   with its figures: that is a replay of the whole job, not a prediction.
//! - Where the trace ends in the out-of-memory error (a snapshot taken at the failure), a
//!   setting whose replay serves the request that failed is *worth trying*, ordered by the
//!   memory the rest of the job is predicted to need; it is never said to fit, and never "not
//!   advised": the trace cannot tell what the rest of the job needs.
//! - A setting whose replay fails there too would not have helped, and is named as such only
//!   where a user would reach for it (PyTorch's message suggests `expandable_segments`, and
//!   every setting is a candidate against fragmentation).

use crate::analysis::outcome::{Decision, JobPrediction, Reach};
use crate::analysis::whatif::PolicyRow;
use crate::model::units::{fmt_bytes, fmt_need};
use serde::Serialize;

/// One piece of advice.
#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    /// `setting`, `capacity` or `code`.
    pub kind: &'static str,
    /// A `PYTORCH_CUDA_ALLOC_CONF=...` value for `setting`.
    pub setting: Option<String>,
    pub text: String,
    /// The figure that justifies it.
    pub evidence: String,
    /// Backed by a replay (of the whole job, or of a code change up to the failure), not by a
    /// prediction or a reading of the layout: the advice is ordered by this, proven first.
    pub proven: bool,
}

/// The first thing to change, decided once: the text, the report's fix line and the JSON show
/// it. The strongest proven advice; else, where the trace stops at the failure, the first
/// setting worth trying whose whole job is not predicted to run out of memory at the limit
/// ([`WorthTrying::predicted_over_limit`]); else, where every setting worth trying is, the
/// advice on how much memory the job needs, where there is one; else the first setting worth
/// trying; else the first advice, labelled unproven.
#[derive(Debug, Clone, Serialize)]
pub struct Fix {
    /// `proven` (backed by a replay), `worth_trying` or `unproven`.
    pub strength: &'static str,
    /// `PYTORCH_CUDA_ALLOC_CONF=...` where the fix is a setting.
    pub setting: Option<String>,
    pub text: String,
    pub evidence: String,
}

impl Fix {
    pub fn of(advice: &[Advice], worth_trying: &[WorthTrying]) -> Option<Fix> {
        let from = |a: &Advice, strength| Fix {
            strength,
            setting: a.setting.clone(),
            text: a.text.clone(),
            evidence: a.evidence.clone(),
        };
        if let Some(a) = advice.iter().find(|a| a.proven) {
            return Some(from(a, "proven"));
        }
        let worth = |w: &WorthTrying| Fix {
            strength: "worth_trying",
            setting: Some(w.setting.clone()),
            text: format!("try {}", w.setting),
            evidence: w.text.clone(),
        };
        if let Some(w) = worth_trying.iter().find(|w| !w.predicted_over_limit) {
            return Some(worth(w));
        }
        // Every setting that gets past the failure is predicted to run out of memory later:
        // what the whole job needs is the answer.
        if let Some(a) = advice.iter().find(|a| a.kind == "capacity").filter(|_| !worth_trying.is_empty()) {
            return Some(from(a, "unproven"));
        }
        if let Some(w) = worth_trying.first() {
            return Some(worth(w));
        }
        advice.first().map(|a| from(a, "unproven"))
    }
    /// The label a text puts before it.
    pub fn label(&self) -> &'static str {
        match self.strength {
            "proven" => "fix",
            "worth_trying" => "worth trying first",
            _ => "suggestion",
        }
    }
}

/// A setting whose replay serves the request that failed, in a trace that ends in the
/// out-of-memory error: the rest of the job is not in the trace, so it is worth trying, not
/// advised.
#[derive(Debug, Clone, Serialize)]
pub struct WorthTrying {
    /// `PYTORCH_CUDA_ALLOC_CONF=...`.
    pub setting: String,
    /// The what-if row's name.
    pub policy: String,
    /// Peak reserved by its replay up to the end of the trace.
    pub peak_reserved_bytes: u64,
    /// Where the limit was not recorded and this setting's replay fails at the least the trace
    /// allows ([`Decision::LimitDecides`]): the limit from which it gets past the failure.
    /// `null` where it gets past at the capacity compared.
    pub gets_past_from_bytes: Option<u64>,
    /// What the whole job is predicted to need under it (from a repeated iteration), if predicted.
    pub predicted_needs_bytes: Option<u64>,
    /// Whether the whole job is predicted to fit at the capacity, if predicted.
    pub predicted_to_fit: Option<bool>,
    /// The whole job is predicted to need more than the limit, or to run out of memory later,
    /// from iterations alike ([`crate::analysis::outcome::Outlook::MoreThanLimit`],
    /// [`crate::analysis::outcome::Outlook::RunsOutLater`]): it gets past this failure only.
    pub predicted_over_limit: bool,
    /// What the prediction says of the whole job under it, as a clause
    /// ([`crate::analysis::outcome::Outlook::clause`]), and for a table's cell (`whole_job_short`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whole_job: Option<String>,
    #[serde(skip)]
    pub whole_job_short: Option<String>,
    pub text: String,
}

/// The allocator setting in the form a user sets it.
pub fn env_setting(alloc_conf: &str) -> String {
    format!("PYTORCH_CUDA_ALLOC_CONF={alloc_conf}")
}

/// The setting to give for a what-if row: its settings, or where they are PyTorch's defaults (a
/// knob turned back, `expandable_segments:False` of a run recorded with it on) the knob itself,
/// never an empty `PYTORCH_CUDA_ALLOC_CONF=`.
pub fn row_setting(r: &PolicyRow) -> String {
    if r.alloc_conf.is_empty() {
        env_setting(r.policy.name())
    } else {
        env_setting(&r.alloc_conf)
    }
}

/// What [`settings_at_oom`] gives: advice, settings worth trying, and what would not help.
#[derive(Debug, Default)]
pub struct SettingsAdvice {
    pub advice: Vec<Advice>,
    pub worth_trying: Vec<WorthTrying>,
    pub not_advised: Vec<String>,
    /// Settings whose replay fails where the recorded run may have caught a failure: the trace
    /// cannot tell whether they help.
    pub cannot_tell: Vec<String>,
}

/// The setting and capacity advice for a replay that runs out of memory at the capacity
/// compared (`capacity`, written `cap_text`). `fragmentation`: the verdict is fragmentation.
/// Where the limit was not recorded, a setting that fails at the least the trace allows but gets
/// past the failure inside the range ([`Decision::LimitDecides`]) may help at the real limit, so
/// it is worth trying, in the order of what the whole job needs under it, never "not advised".
pub fn settings_at_oom(
    rows: &[PolicyRow],
    prediction: Option<&JobPrediction>,
    capacity: Option<u64>,
    cap_text: &str,
    fragmentation: bool,
) -> SettingsAdvice {
    let b = fmt_bytes;
    let mut out = SettingsAdvice::default();
    let mut fits: Vec<&PolicyRow> = rows.iter().filter(|r| r.decision == Decision::Fits).collect();
    fits.sort_by_key(|r| r.peak_reserved_bytes);
    for r in &fits {
        out.advice.push(Advice {
            kind: "setting",
            setting: Some(row_setting(r)),
            text: format!("set {}", row_setting(r)),
            evidence: format!(
                "the whole job, replayed under it at {cap_text}, completes (peak reserved {}, {} device calls){}",
                b(r.peak_reserved_bytes),
                r.num_device_alloc + r.num_device_free,
                r.min_capacity_bytes.map(|m| format!("; it needs {}", fmt_need(m))).unwrap_or_default()
            ),
            proven: true,
        });
    }
    // Worth trying: gets past the failure; ordered by what the rest of the job is predicted to
    // need, else by what the replay reserved up to the failure.
    let predicted = |r: &PolicyRow| prediction.and_then(|p| p.of(&r.policy));
    let outlook = |r: &PolicyRow| Some(prediction?.outlook(predicted(r)?, capacity));
    // Where the limit was not recorded, a setting that gets past the failure only from a limit
    // inside the range the trace allows is worth trying too, ordered by the same figures: the
    // least the whole job needs, else the least limit that gets past the failure (a setting
    // that gets past at every limit of the range first).
    let mut past: Vec<&PolicyRow> =
        rows.iter().filter(|r| matches!(r.decision, Decision::WorthTrying | Decision::LimitDecides)).collect();
    past.sort_by_key(|r| {
        let from = if r.decision == Decision::LimitDecides { r.min_capacity_bytes.unwrap_or(u64::MAX) } else { 0 };
        (predicted(r).and_then(|p| p.needs_bytes).unwrap_or(u64::MAX), from, r.peak_reserved_bytes)
    });
    for r in past {
        let p = predicted(r);
        out.worth_trying.push(WorthTrying {
            setting: row_setting(r),
            policy: r.policy.to_string(),
            peak_reserved_bytes: r.peak_reserved_bytes,
            gets_past_from_bytes: r.min_capacity_bytes.filter(|_| r.decision == Decision::LimitDecides),
            predicted_needs_bytes: p.and_then(|p| p.needs_bytes),
            predicted_to_fit: p.map(|p| p.fits),
            predicted_over_limit: outlook(r).is_some_and(|o| {
                matches!(
                    o,
                    crate::analysis::outcome::Outlook::MoreThanLimit(_)
                        | crate::analysis::outcome::Outlook::RunsOutLater
                )
            }),
            whole_job: outlook(r).map(|o| o.clause()),
            whole_job_short: outlook(r).map(|o| o.short()),
            text: if let (Decision::LimitDecides, Some(m)) = (r.decision, r.min_capacity_bytes) {
                format!(
                    "its replay gets past the failure from {}, inside the limits the trace allows (it fails at \
{cap_text}, the least; give the real one with --capacity){}",
                    fmt_need(m),
                    outlook(r).map(|o| format!("; {}", o.clause())).unwrap_or_default()
                )
            } else if r.fits_by_placement {
                format!(
                    "the whole job, replayed under it at {cap_text}, completes (peak reserved {}), yet fails at larger \
limits (it completes from {}): where its blocks land decides it, which depends on where the CUDA driver places \
segments, and the trace tells that only for the recorded settings",
                    b(r.peak_reserved_bytes),
                    r.min_capacity_bytes.map(fmt_need).unwrap_or_default()
                )
            } else if r.scratch_failures_skipped > 0 {
                format!(
                    "its replay at {cap_text} goes through when the {} cuDNN workspace request(s) that fail there are \
left out: PyTorch's cuDNN catches such a failure and tries a plan with a smaller workspace, which the trace does not \
hold",
                    r.scratch_failures_skipped
                )
            } else {
                format!(
                    "its replay serves the request that failed at {cap_text} (peak reserved {} up to there){}",
                    b(r.peak_reserved_bytes),
                    outlook(r).map(|o| format!("; {}", o.clause())).unwrap_or_default()
                )
            },
        });
    }
    // More memory, where no setting fits at the capacity: it may name a setting that needs less.
    // The setting the first pick will name, with its whole job's figure: not named again.
    let first = out.worth_trying.iter().find(|w| !w.predicted_over_limit).map(|w| w.setting.clone());
    let more = if fits.is_empty() { more_memory(rows, prediction, capacity, cap_text, first.as_deref()) } else { None };
    let advised = more.as_ref().and_then(|a| a.setting.clone());
    // Would not have helped, grouped by why (one line each). The setting that the advice to give
    // more memory names is not also "not advised" (it fails at this limit, and the advice says
    // what it needs); one whose replay fails where the program may have caught the failure is
    // "cannot tell", not "not advised".
    let mut groups: Vec<(bool, String, Vec<String>)> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| matches!(r.decision, Decision::DoesNotHelp | Decision::DoesNotFit | Decision::CannotTell))
    {
        let expandable = r.policy.name().starts_with("expandable_segments:True");
        if !(expandable || fragmentation) || advised.as_deref() == Some(row_setting(r).as_str()) {
            continue;
        }
        let why = match (r.decision, r.reach) {
            (Decision::DoesNotFit, _) => format!("the whole job, replayed at {cap_text}, runs out of memory"),
            (_, Reach::FailsEarlier) => format!("replayed at {cap_text}, fails earlier than the recorded run"),
            (Decision::CannotTell, _) => format!(
                "replayed at {cap_text}, each fails at a request the recorded run served, which the program may \
catch (a cuDNN workspace): a trace recorded under it would tell"
            ),
            _ => format!("replayed at {cap_text}, fails at the same request"),
        };
        // PyTorch's message (restated above the verdict) names it after every out-of-memory
        // error, whatever the cause: said where it is ruled out here, so the two do not read as
        // contradicting each other.
        let why = if expandable && r.decision != Decision::CannotTell {
            format!("{why} (PyTorch's message suggests it after every out-of-memory error, whatever the cause)")
        } else {
            why
        };
        // Each one's smallest capacity is in the what-if table.
        let name = r.policy.to_string();
        let unknown = r.decision == Decision::CannotTell;
        match groups.iter_mut().find(|g| g.1 == why) {
            Some(g) => g.2.push(name),
            None => groups.push((unknown, why, vec![name])),
        }
    }
    for (unknown, why, names) in groups {
        let line = format!("{}: {why}", names.join(", "));
        if unknown {
            out.cannot_tell.push(line);
        } else {
            out.not_advised.push(line);
        }
    }
    out.advice.extend(more);
    out
}

/// Whether the whole job is in the trace: it ends without an out-of-memory error, so a replay
/// that serves every request completes the job.
fn whole_job(rows: &[PolicyRow]) -> bool {
    rows.iter().any(|r| matches!(r.reach, Reach::Completes | Reach::RunsOutOfMemory))
}

/// How much memory to give the process, where no setting fits at the capacity.
fn more_memory(
    rows: &[PolicyRow],
    prediction: Option<&JobPrediction>,
    capacity: Option<u64>,
    cap_text: &str,
    first_pick: Option<&str>,
) -> Option<Advice> {
    let recorded = rows.iter().find(|r| r.policy.is_recorded())?;
    // The recorded settings run out of memory at the capacity, yet the search found a smaller
    // limit where the replay gets through: more memory is no sure fix there, and the smallest
    // limit is not "more".
    if let Some((rec, cap)) = recorded.min_capacity_bytes.zip(capacity).filter(|(rec, cap)| rec <= cap) {
        let through = if whole_job(rows) { "completes the job" } else { "gets past the request that failed" };
        return Some(Advice {
            kind: "capacity",
            setting: None,
            text: format!(
                "more memory is no sure fix: under the recorded settings, the replay at {} {through}, and \
the one at {cap_text} does not; where the blocks land decides it (replay --capacity N checks a limit N)",
                fmt_need(rec)
            ),
            evidence: format!(
                "the smallest limit the capacity search found under the recorded settings, {} ({} bytes), is not \
above the limit compared ({cap} bytes), where the replay runs out of memory",
                fmt_need(rec),
                rec
            ),
            proven: false,
        });
    }
    // The whole job is in the trace: the smallest capacity is a replay of it.
    if whole_job(rows) {
        let rec = recorded.min_capacity_bytes?;
        let best = rows.iter().filter_map(|r| r.min_capacity_bytes.map(|m| (m, r))).min_by_key(|(m, _)| *m);
        // Each figure is a replay of the whole job: any setting that needs less is named.
        let setting = best.filter(|(m, r)| !r.policy.is_recorded() && *m < rec);
        return Some(Advice {
            kind: "capacity",
            setting: setting.map(|(_, r)| row_setting(r)),
            text: match setting {
                Some((m, r)) => format!(
                    "give the process {} (the whole job needs that with {}; {} under the recorded settings)",
                    fmt_need(m),
                    row_setting(r),
                    fmt_need(rec)
                ),
                None => format!(
                    "give the process {} (the whole job needs that; no setting fits it at {cap_text})",
                    fmt_need(rec)
                ),
            },
            evidence: match setting {
                Some((m, r)) => format!(
                    "the smallest capacity at which the replay of the whole job completes: {} ({m} bytes) with {}, {} \
({rec} bytes) under the recorded settings",
                    fmt_need(m),
                    row_setting(r),
                    fmt_need(rec)
                ),
                None => format!(
                    "the smallest capacity at which the replay of the whole job completes: {} ({rec} bytes) under the \
recorded settings",
                    fmt_need(rec)
                ),
            },
            proven: true,
        });
    }
    match prediction {
        Some(p @ JobPrediction::FromRepeatedIteration { policies, .. }) => {
            let rec = policies.iter().find(|p| p.policy.is_recorded()).and_then(|p| p.needs_bytes)?;
            // The setting that needs least, where it needs less than the recorded settings.
            let best = policies
                .iter()
                .filter_map(|p| p.needs_bytes.map(|n| (n, p)))
                .min_by_key(|(n, _)| *n)
                .filter(|(n, p)| !p.policy.is_recorded() && *n < rec)
                .and_then(|(n, p)| rows.iter().find(|r| r.policy == p.policy).map(|r| (n, row_setting(r))));
            let setting = best.clone().filter(|(n, _)| (*n as f64) < 0.9 * rec as f64);
            // Where the figures hold only if later iterations ask no more, the advice says so.
            // Hedged, the figure reads as the condition's, as every hedged figure does
            // ([`crate::analysis::outcome::Outlook::IfAlike`]).
            let (needs, hedge) = if p.alike_unknown() {
                ("needs", " if later iterations ask no more")
            } else {
                ("is predicted to need", "")
            };
            Some(Advice {
                kind: "capacity",
                setting: setting.as_ref().map(|s| s.1.clone()),
                text: match &setting {
                    Some((n, s)) => {
                        format!("the whole job {needs} about {} with {s}{hedge}", fmt_need(*n))
                    }
                    None => {
                        // A setting that needs less, though not by a tenth, is named beside.
                        let less = best
                            .clone()
                            .filter(|(_, s)| first_pick != Some(s.as_str()))
                            .map(|(n, s)| format!(" ({} with {s})", fmt_need(n)))
                            .unwrap_or_default();
                        format!(
                            "the whole job {needs} about {} under the recorded settings{less}{hedge}",
                            fmt_need(rec)
                        )
                    }
                },
                evidence: format!("{} (a prediction, not a replay of the job)", p.basis()),
                proven: false,
            })
        }
        _ => {
            let rec = recorded.min_capacity_bytes?;
            Some(Advice {
                kind: "capacity",
                setting: None,
                text: format!(
                    "with more memory than {cap_text}: from {} the program gets past the request that failed; whether \
the rest of the job fits is not in the trace",
                    fmt_need(rec)
                ),
                evidence: format!(
                    "the smallest capacity at which the replay gets past the failed request, under the recorded \
settings: {}",
                    fmt_need(rec)
                ),
                proven: false,
            })
        }
    }
}
