//! Call sites resolved after their events: the default back-end's Python stacks.
//!
//! PyTorch gathers an allocation's Python stack before it takes its allocator's lock (when its
//! history records context), and hands it to the trace tracker with the event. Turning it into
//! file names, functions and lines needs the GIL, which must never be taken under that lock. So
//! the tracker only gives the stack an id (the same stack, the same id) and the event carries
//! that id at once; a background thread that takes the GIL resolves new ids in batches and
//! [`SiteTable::define`]s them here.
//!
//! The trace format wants a call site defined before its first use. The writer keeps that
//! promise ([`SiteGate`]): before it writes an event whose call site this trace has not yet
//! defined, it writes the definition, waiting for it if the resolver has not delivered it yet
//! (a short, bounded wait: see [`SiteGate::WAIT`]). So every chunk that reaches the file holds
//! the definitions of the call sites it uses, and a `kill -9` loses no more than the last
//! flush. A site that did not come in time, or never (the table was closed: the program is
//! ending), is written as no call site; a later use that finds it defined names it.

use crate::trace::{Frame, NO_CALLSITE};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Call-site definitions delivered by a resolver, for the writers of every trace of the process
/// (one per device).
#[derive(Default, Debug)]
pub struct SiteTable {
    inner: Mutex<Inner>,
    defined: Condvar,
}

#[derive(Default, Debug)]
struct Inner {
    frames: HashMap<u32, Arc<Vec<Frame>>>,
    /// No more definitions will come: writers stop waiting.
    closed: bool,
}

/// Frames of the recorder's own Python shim: never the program's, never written.
pub fn is_recorder_frame(file: &str) -> bool {
    let name = file.rsplit(['/', '\\']).next().unwrap_or(file);
    name == "alloctrace_hook.py"
}

impl SiteTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Defines call site `id` (innermost frame first). The recorder's own frames are left out.
    /// A stack of nothing else (or none: a resolver that could not resolve `id` says so) names
    /// no call site, and writers stop waiting for it. A second definition of an id is ignored.
    pub fn define(&self, id: u32, frames: Vec<Frame>) {
        if id == NO_CALLSITE {
            return;
        }
        let frames: Vec<Frame> = frames.into_iter().filter(|f| !is_recorder_frame(&f.file)).collect();
        let mut g = self.lock();
        g.frames.entry(id).or_insert_with(|| Arc::new(frames));
        drop(g);
        self.defined.notify_all();
    }

    /// No more definitions will come (the resolver has stopped): writers no longer wait. Does
    /// nothing where the table's lock is held by a thread that does not exist (a forked child).
    pub fn close(&self) {
        let g = match self.inner.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(mut g) = g {
            g.closed = true;
            drop(g);
            self.defined.notify_all();
        }
    }

    /// Whether [`SiteTable::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The frames of `id`, waiting at most `wait` for them while the table is open.
    pub fn frames(&self, id: u32, wait: Duration) -> Option<Arc<Vec<Frame>>> {
        let deadline = Instant::now() + wait;
        let mut g = self.lock();
        loop {
            if let Some(f) = g.frames.get(&id) {
                return Some(f.clone());
            }
            let now = Instant::now();
            if g.closed || now >= deadline {
                return None;
            }
            g = self.defined.wait_timeout(g, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// The writer's side of a [`SiteTable`]: which call sites one trace has defined.
pub(crate) struct SiteGate {
    table: Arc<SiteTable>,
    /// Bit `id` set: defined in this trace.
    defined: Vec<u64>,
    /// Ids whose definition did not come within [`SiteGate::WAIT`]: later uses do not wait.
    late: Vec<u64>,
    /// Uses written as no call site because their definition had not come.
    pub unresolved: u64,
}

fn bit(bits: &[u64], id: u32) -> bool {
    bits.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
}

fn set_bit(bits: &mut Vec<u64>, id: u32) {
    let i = id as usize / 64;
    if bits.len() <= i {
        bits.resize(i + 1, 0);
    }
    bits[i] |= 1 << (id % 64);
}

impl SiteGate {
    /// How long the writer waits for one call site's definition. The resolver delivers within
    /// a few GIL switch intervals (5 ms each); the writer's queue holds far more than this.
    pub const WAIT: Duration = Duration::from_millis(500);

    pub fn new(table: Arc<SiteTable>) -> Self {
        SiteGate { table, defined: Vec::new(), late: Vec::new(), unresolved: 0 }
    }

    /// A use of call site `id` is about to be written: the definition to write first (the
    /// first use in this trace), and the id to write (no call site where none came).
    pub fn admit(&mut self, id: u32) -> (Option<Arc<Vec<Frame>>>, u32) {
        if id == NO_CALLSITE || bit(&self.defined, id) {
            return (None, id);
        }
        let wait = if bit(&self.late, id) { Duration::ZERO } else { Self::WAIT };
        match self.table.frames(id, wait) {
            Some(f) if !f.is_empty() => {
                set_bit(&mut self.defined, id);
                (Some(f), id)
            }
            // Resolved to nothing of the program's.
            Some(_) => (None, NO_CALLSITE),
            None => {
                set_bit(&mut self.late, id);
                self.unresolved += 1;
                (None, NO_CALLSITE)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: u32, function: &str) -> Frame {
        Frame { file: file.into(), line, function: function.into() }
    }

    #[test]
    fn the_recorders_own_frames_are_left_out() {
        let t = SiteTable::new();
        t.define(
            3,
            vec![
                frame("/tmp/alloctrace-Xy/alloctrace_hook.py", 135, "backward"),
                frame("/opt/venv/lib/python3.12/site-packages/torch/_tensor.py", 625, "backward"),
                frame("train.py", 9, "step"),
            ],
        );
        let f = t.frames(3, Duration::ZERO).unwrap();
        assert_eq!(f.iter().map(|f| f.line).collect::<Vec<_>>(), vec![625, 9]);
        // A stack of the shim alone names nothing; a second definition changes nothing.
        t.define(4, vec![frame("alloctrace_hook.py", 1, "f")]);
        assert!(t.frames(4, Duration::ZERO).unwrap().is_empty());
        assert_eq!(SiteGate::new(Arc::new(SiteTable::new())).admit(0).1, NO_CALLSITE);
        let mut gate = SiteGate::new(Arc::new(t));
        assert_eq!(gate.admit(4), (None, NO_CALLSITE));
        assert_eq!(gate.unresolved, 0);
        let t = gate.table.clone();
        t.define(3, vec![frame("other.py", 1, "g")]);
        assert_eq!(t.frames(3, Duration::ZERO).unwrap().len(), 2);
    }

    #[test]
    fn the_gate_defines_once_and_waits_for_a_late_definition() {
        let t = Arc::new(SiteTable::new());
        let mut gate = SiteGate::new(t.clone());
        assert_eq!(gate.admit(NO_CALLSITE), (None, NO_CALLSITE));
        let resolver = {
            let t = t.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                t.define(7, vec![frame("model.py", 20, "forward")]);
            })
        };
        // Not defined yet: the gate waits for the resolver.
        let (def, id) = gate.admit(7);
        assert_eq!(id, 7);
        assert_eq!(def.unwrap()[0].function, "forward");
        // Defined in this trace now: later uses carry the id alone.
        assert_eq!(gate.admit(7), (None, 7));
        resolver.join().unwrap();
        // Closed: no wait, no call site, counted.
        t.close();
        let start = Instant::now();
        assert_eq!(gate.admit(8), (None, NO_CALLSITE));
        assert!(start.elapsed() < SiteGate::WAIT);
        assert_eq!(gate.unresolved, 1);
        // A definition that comes after all is used by later uses.
        t.define(8, vec![frame("model.py", 30, "forward")]);
        assert_eq!(gate.admit(8).1, 8);
    }
}
