//! The moment to look at in detail (`--at` of `frag` and of `plot --kind segments`), and where
//! it falls in one replay: decided here, once, for both commands and for `report`, by an
//! observer of that replay ([`Moments`]). The OOM moment itself is [`OomMoment`]'s.

use crate::model::Trace;
use crate::replay::{EngineView, OomMoment};
use anyhow::{anyhow, bail, Result};
use recorder::trace::{Event, Record};
use serde::Serialize;

/// The moment to show in detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    /// When reserved bytes first reached their peak.
    Peak,
    /// The OOM moment ([`OomMoment`]): the first failure the program did not catch, or the
    /// trace's fatal recorded OOM.
    Oom,
    /// After the last event the replay took: the trace's last, or the failure it stopped at.
    End,
    /// After the event with this index.
    Event(u64),
}

impl At {
    /// Parses `peak`, `oom`, `end` or an event index.
    pub fn parse(s: &str) -> Result<At, String> {
        match s {
            "peak" => Ok(At::Peak),
            "oom" => Ok(At::Oom),
            "end" => Ok(At::End),
            n => n
                .parse::<u64>()
                .map(At::Event)
                .map_err(|_| format!("expected peak, oom, end or an event index, got {n:?}")),
        }
    }
}

impl std::str::FromStr for At {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        At::parse(s)
    }
}

/// Where a moment fell in the replay ([`Moments::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    pub event: u64,
    pub kind: MomentKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MomentKind {
    /// The first event at the replay's peak of reserved bytes.
    Peak { reserved_bytes: u64 },
    /// The OOM moment, and the size the failed request asked for.
    Oom { requested_bytes: u64 },
    /// The replay's last event; `stopped`: it stopped there, out of memory.
    End { stopped: bool },
    /// An event asked for by its index.
    Event,
}

/// What one record of the replay is ([`Moments::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passing {
    /// Reserved bytes reach a new peak here.
    pub peak: bool,
    /// This record is the OOM moment.
    pub oom: bool,
    /// The replay ends here: the trace's last record, or a failure it stops at.
    pub end: bool,
    /// The replay stopped here, out of memory.
    pub stopped: bool,
}

impl Passing {
    /// Whether this record is the moment `at`, where the moment is known as the replay passes
    /// it (a peak is known only once the replay has ended: never here).
    pub fn is(&self, at: At, i: u64) -> bool {
        match at {
            At::Peak => false,
            At::Oom => self.oom,
            At::End => self.end,
            At::Event(e) => i == e,
        }
    }
}

/// Where each moment falls in one replay: fed by an observer after each record.
#[derive(Debug, Clone, Default)]
pub struct Moments {
    /// The first event at the peak of reserved bytes, and the peak.
    peak: Option<(u64, u64)>,
    last: Option<u64>,
    oom: OomMoment,
    /// The OOM moment and the size the failed request asked for.
    oom_at: Option<(u64, u64)>,
    stopped_at: Option<u64>,
}

impl Moments {
    pub fn observe(&mut self, trace: &Trace, i: u64, r: &Record, view: &dyn EngineView) -> Passing {
        let reserved = view.stats().reserved_bytes.all.current;
        let peak = reserved > self.peak.map_or(0, |p| p.1);
        if peak {
            self.peak = Some((i, reserved));
        }
        self.last = Some(i);
        let o = self.oom.observe(trace, i, r, view);
        if o.moment {
            let requested = match &r.event {
                Event::Alloc { requested_bytes, .. } | Event::Oom { requested_bytes, .. } => *requested_bytes,
                _ => 0,
            };
            self.oom_at = Some((i, requested));
        }
        if o.stopped {
            self.stopped_at = Some(i);
        }
        Passing { peak, oom: o.moment, end: o.stopped || i + 1 >= trace.events, stopped: o.stopped }
    }

    /// Where `at` fell in the replay observed.
    pub fn resolve(&self, trace: &Trace, at: At) -> Result<Moment> {
        let path = trace.path.display();
        Ok(match at {
            At::Event(event) => Moment { event, kind: MomentKind::Event },
            At::Peak => {
                let (event, reserved_bytes) = self.peak.ok_or_else(|| anyhow!("{path}: nothing was ever reserved"))?;
                Moment { event, kind: MomentKind::Peak { reserved_bytes } }
            }
            At::End => {
                let event = self.last.ok_or_else(|| anyhow!("{path}: the trace has no events"))?;
                Moment { event, kind: MomentKind::End { stopped: self.stopped_at == Some(event) } }
            }
            At::Oom => match self.oom_at {
                Some((event, requested_bytes)) => Moment { event, kind: MomentKind::Oom { requested_bytes } },
                None => bail!("{}", OomMoment::missing(trace)),
            },
        })
    }

    /// The event the replay stopped at, out of memory, once passed.
    pub fn stopped_at(&self) -> Option<u64> {
        self.stopped_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_parses() {
        assert_eq!(At::parse("peak"), Ok(At::Peak));
        assert_eq!("end".parse::<At>(), Ok(At::End));
        assert_eq!(At::parse("12"), Ok(At::Event(12)));
        assert!(At::parse("soon").is_err());
    }
}
