//! The recorder's lock: one atomic exchange to take it, a plain store to give it back.
//!
//! `std::sync::Mutex` releases with an atomic swap (it must learn whether a thread sleeps on
//! the lock), and a locked instruction waits until every store of the critical section has
//! left the store buffer: a cached allocation makes dozens, so that release cost as much as the
//! engine's own work for the call. Here the release is a store with release ordering, which
//! waits for nothing.
//!
//! The price is that a waiter cannot be woken, so it polls: it spins briefly (the critical
//! section is usually a fraction of a microsecond), then yields its time slice, then sleeps in
//! short steps (a holder may be inside a device call of a millisecond or more). Allocations
//! from many threads at once are rare in GPU programs; the benchmark measures the common case.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(crate) struct Lock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, and at most one guard exists at a time
// (the `locked` flag, taken with acquire and released with release ordering), exactly as for a
// mutex.
unsafe impl<T: Send> Sync for Lock<T> {}
unsafe impl<T: Send> Send for Lock<T> {}

pub(crate) struct Guard<'a, T> {
    lock: &'a Lock<T>,
    /// A guard gives `&mut T`: it is `Sync` only where `T` is, as `MutexGuard` is.
    _value: PhantomData<&'a mut T>,
}

impl<T> Lock<T> {
    pub const fn new(value: T) -> Self {
        Lock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        Guard { lock: self, _value: PhantomData }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut round = 0u32;
        loop {
            if !self.locked.load(Ordering::Relaxed)
                && self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return;
            }
            round = round.saturating_add(1);
            match round {
                0..=100 => std::hint::spin_loop(),
                101..=1100 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(20)),
            }
        }
    }

    /// Takes the lock and keeps it until [`Lock::force_unlock`] (for `fork`: held across it,
    /// so that no thread is inside the critical section when the process is copied).
    pub fn lock_and_keep(&self) {
        std::mem::forget(self.lock());
    }

    /// Gives back a lock kept by [`Lock::lock_and_keep`], first running `f` on the value.
    ///
    /// # Safety
    /// The caller took the lock with `lock_and_keep` and no guard exists.
    pub unsafe fn force_unlock(&self, f: impl FnOnce(&mut T)) {
        // SAFETY: the caller holds the lock (kept by `lock_and_keep`), so this is the only access.
        f(unsafe { &mut *self.value.get() });
        self.locked.store(false, Ordering::Release);
    }

    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        // A guard exists only once the lock is taken: one built and dropped on failure would
        // release the holder's lock.
        match self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Some(Guard { lock: self, _value: PhantomData }),
            Err(_) => None,
        }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see `Sync`).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    /// Also runs when the holder panics: a panic elsewhere must not stop every later call.
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Four threads increment a shared counter under the lock (non-atomically): no increment is
    /// lost, and a holder that sleeps makes the others wait rather than enter.
    #[test]
    fn excludes() {
        let lock = Arc::new(Lock::new((0u64, false)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        let mut g = lock.lock();
                        assert!(!g.1, "two holders at once");
                        g.1 = true;
                        let v = g.0;
                        if i % 5_000 == 0 && t == 0 {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        g.0 = v + 1;
                        g.1 = false;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(lock.lock().0, 80_000);
        let g = lock.lock();
        assert!(lock.try_lock().is_none());
        assert!(lock.try_lock().is_none(), "a failed try_lock left the lock taken");
        drop(g);
        assert!(lock.try_lock().is_some());
    }

    /// A panic while holding the lock releases it.
    #[test]
    fn a_panicking_holder_releases() {
        let lock = Arc::new(Lock::new(1u32));
        let l2 = lock.clone();
        let r = std::thread::spawn(move || {
            let _g = l2.lock();
            panic!("holder fails");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.lock(), 1);
    }
}
