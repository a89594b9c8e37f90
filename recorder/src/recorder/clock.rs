//! The trace clock: a cheap tick read on the allocating thread, turned into nanoseconds since
//! the recorder started by the writer thread.
//!
//! Each `malloc` and `free` reads the clock once, so its price is paid twice per pair. Reading
//! `CLOCK_MONOTONIC` costs 25–35 ns in a virtual machine, the time stamp counter (`rdtsc`)
//! about half that, and the recorder's whole budget is a few tens of nanoseconds. Where the
//! counter is trustworthy (x86-64 with an invariant TSC that Linux itself uses as its clock
//! source), records carry raw counter ticks and the writer converts them:
//!
//! ```text
//! ns(t) = (t - t0) * (m1 - m0) / (t1 - t0)      (t0, m0): counter and monotonic clock at start
//!                                               (t1, m1): the same pair, read just now
//! ```
//! The writer reads a fresh pair before converting each batch, so every converted tick lies
//! between the two calibration points: the error is that of one clock read (tens of ns), and
//! does not grow with the length of the run. Elsewhere ticks are `CLOCK_MONOTONIC`
//! nanoseconds and the conversion is a subtraction. PyTorch's allocator history does the same
//! (`c10::getApproximateTime`, converted when the snapshot is taken).

/// Monotonic nanoseconds (`CLOCK_MONOTONIC`, the clock `Instant` reads).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer to a `struct timespec` (two 64-bit fields on 64-bit Linux);
    // CLOCK_MONOTONIC always exists, so the call cannot fail. `Instant::elapsed` would cost
    // three times this read (a second normalised subtraction and a `u128` conversion).
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
pub(crate) fn monotonic_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    monotonic_ns()
}

/// True when the time stamp counter can stand in for the monotonic clock: the processor says
/// it is invariant (constant rate, runs in every power state) and the kernel chose it as its
/// clock source (so it is synchronised across cores).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn tsc_is_reliable() -> bool {
    use core::arch::x86_64::__cpuid;
    // Leaf 0x8000_0007 (advanced power management), read only when the processor has it.
    let invariant = __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0;
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    invariant && source.is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn tsc_is_reliable() -> bool {
    false
}

/// Which source the recorder's clock reads on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// The time stamp counter, converted by the writer.
    Tsc,
    /// `CLOCK_MONOTONIC` nanoseconds.
    Monotonic,
}

impl ClockSource {
    pub fn describe(self) -> &'static str {
        match self {
            ClockSource::Tsc => "time stamp counter, calibrated against CLOCK_MONOTONIC",
            ClockSource::Monotonic => "CLOCK_MONOTONIC",
        }
    }
}

/// The recorder's clock: its origin and source. Cheap to read from any thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    source: ClockSource,
    origin_ticks: u64,
    origin_ns: u64,
}

impl Clock {
    /// Starts the clock now; `allow_tsc` = false forces the monotonic clock.
    pub fn start(allow_tsc: bool) -> Clock {
        let source = if allow_tsc && tsc_is_reliable() { ClockSource::Tsc } else { ClockSource::Monotonic };
        let (origin_ticks, origin_ns) = match source {
            ClockSource::Tsc => read_pair(),
            ClockSource::Monotonic => {
                let ns = monotonic_ns();
                (ns, ns)
            }
        };
        Clock { source, origin_ticks, origin_ns }
    }

    pub fn source(&self) -> ClockSource {
        self.source
    }

    /// A tick count for a record's timestamp, to be converted by a [`TickConverter`].
    #[inline]
    pub fn ticks(&self) -> u64 {
        match self.source {
            ClockSource::Tsc => rdtsc(),
            ClockSource::Monotonic => monotonic_ns(),
        }
    }

    /// Nanoseconds since the origin, read from the monotonic clock.
    pub fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.origin_ns)
    }

    pub fn converter(&self) -> TickConverter {
        TickConverter { clock: *self, ns_per_tick: 1.0, last_ns: 0 }
    }
}

/// A counter and monotonic reading taken together: the counter's midpoint around the clock
/// read, retried when the thread was interrupted in between.
fn read_pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..5 {
        let a = rdtsc();
        let ns = monotonic_ns();
        let b = rdtsc();
        let width = b.wrapping_sub(a);
        if width < best.0 {
            best = (width, a + width / 2, ns);
        }
        if width < 2_000 {
            break;
        }
    }
    (best.1, best.2)
}

/// Converts ticks to nanoseconds since the clock's origin; kept by the writer thread.
pub(crate) struct TickConverter {
    clock: Clock,
    ns_per_tick: f64,
    /// The latest time handed out: times never go backwards.
    last_ns: u64,
}

impl TickConverter {
    /// Counter ticks spanned before a calibration is trusted (a fraction of a millisecond).
    const MIN_SPAN_TICKS: u64 = 1 << 20;

    /// Reads a new calibration point: every tick read before this call converts between the
    /// origin and this point.
    pub fn calibrate(&mut self) {
        if self.clock.source != ClockSource::Tsc {
            return;
        }
        loop {
            let (ticks, ns) = read_pair();
            let span = ticks.saturating_sub(self.clock.origin_ticks);
            let elapsed = ns.saturating_sub(self.clock.origin_ns);
            // A counter that barely moves in 10 ms is not one to convert with: keep the last
            // ratio rather than wait (only a broken clock source gets here).
            if span >= Self::MIN_SPAN_TICKS || (elapsed > 10_000_000 && span > 0) {
                self.ns_per_tick = elapsed as f64 / span as f64;
                return;
            }
            if elapsed > 10_000_000 {
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// Nanoseconds since the origin of a tick read by [`Clock::ticks`], in the order the records
    /// were written: never earlier than the time before it. Each batch converts with the
    /// latest calibration, so two ticks a few nanoseconds apart on either side of a batch
    /// boundary could otherwise swap by a few hundred nanoseconds; and a thread that read the
    /// clock just before another took the lock gets that thread's time.
    #[inline]
    pub fn convert(&mut self, ticks: u64) -> u64 {
        let since = ticks.saturating_sub(self.clock.origin_ticks);
        let ns = match self.clock.source {
            ClockSource::Tsc => (since as f64 * self.ns_per_tick) as u64,
            ClockSource::Monotonic => since,
        };
        self.monotone(ns)
    }

    /// `ns`, or the latest time handed out if that is later.
    #[inline]
    pub fn monotone(&mut self, ns: u64) -> u64 {
        self.last_ns = self.last_ns.max(ns);
        self.last_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Converted ticks agree with the monotonic clock read at the same moments, whichever
    /// source this machine allows.
    #[test]
    fn ticks_convert_to_monotonic_time() {
        for allow_tsc in [true, false] {
            let clock = Clock::start(allow_tsc);
            let mut conv = clock.converter();
            let mut samples = Vec::new();
            for _ in 0..5 {
                std::thread::sleep(std::time::Duration::from_millis(2));
                samples.push((clock.now_ns(), clock.ticks(), clock.now_ns()));
            }
            conv.calibrate();
            // Bracketed by two clock reads, so a preempted test thread cannot fail it; the slack
            // covers the calibration's own error.
            let slack = 50_000;
            for (before, ticks, after) in samples {
                let got = conv.convert(ticks);
                assert!(
                    got + slack >= before && got <= after + slack,
                    "{:?}: {got} not in [{before}, {after}]",
                    clock.source()
                );
            }
        }
    }
}
