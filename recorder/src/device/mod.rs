//! Where segments come from: the [`Device`] trait, the simulated device used by replays and
//! tests, and (with the `cuda` feature) the real CUDA device, the only code that touches CUDA.

mod placement;
pub mod sim;
pub use sim::SimDevice;

/// A source of device memory for the engine.
///
/// Two ways to get memory, as PyTorch's allocator has them: whole segments (`cudaMalloc`), and
/// for expandable segments a reserved virtual range into which physical pages are mapped
/// (`cuMemAddressReserve` + `cuMemCreate`/`cuMemMap`/`cuMemSetAccess`).
///
/// Methods return `None`/`false` when the device is out of memory; the engine then runs its
/// OOM path. Errors that are not "out of memory" are the implementation's to report (the
/// CUDA device records them and answers as out of memory, so a job sees PyTorch's behaviour).
pub trait Device {
    /// Allocates a segment of `bytes` for `stream`; `None` when out of memory.
    fn alloc_segment(&mut self, bytes: u64, stream: u64) -> Option<u64>;
    /// Returns a segment obtained from `alloc_segment`.
    fn free_segment(&mut self, addr: u64, bytes: u64);
    /// Reserves `bytes` of address space (no memory yet) for an expandable segment.
    fn reserve_address_space(&mut self, bytes: u64) -> Option<u64>;
    /// Releases a range from `reserve_address_space` (all of it unmapped).
    fn release_address_space(&mut self, addr: u64, bytes: u64);
    /// Maps physical memory at `[addr, addr + bytes)` inside a reserved range; false when out
    /// of memory. `bytes` is a whole number of pages.
    fn map(&mut self, addr: u64, bytes: u64, stream: u64) -> bool;
    /// Unmaps and releases the physical memory at `[addr, addr + bytes)`.
    fn unmap(&mut self, addr: u64, bytes: u64);
    /// `(free, total)` device memory as the driver reports it, when known.
    fn mem_info(&mut self) -> Option<(u64, u64)> {
        None
    }
    /// Waits for all work on all streams (before `empty_cache` releases memory).
    fn synchronize(&mut self) {}
    /// Records an event on `stream` marking the work queued there so far (`record_stream`:
    /// a block used on that stream is reusable once the event completes). `None`: no event
    /// could be made; the caller waits with [`Device::synchronize`] instead.
    fn record_event(&mut self, _stream: u64) -> Option<u64> {
        None
    }
    /// True once the work before `event` is done (a query that does not wait).
    fn event_done(&mut self, _event: u64) -> bool {
        true
    }
    /// Waits for `event`.
    fn wait_event(&mut self, _event: u64) {}
    /// Destroys an event from [`Device::record_event`].
    fn destroy_event(&mut self, _event: u64) {}
}

#[cfg(feature = "cuda")]
pub mod cuda;
