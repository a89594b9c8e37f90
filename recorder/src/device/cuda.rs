//! The CUDA device: segments from `cuMemAlloc`/`cuMemFree`, expandable segments through the
//! virtual memory management API. The only module of alloctrace that touches CUDA.
//!
//! The driver library is loaded at run time (cudarc's `dynamic-loading`), so this builds on
//! machines without CUDA; [`CudaDevice::new`] fails with [`CudaError::NoDriver`] where no
//! `libcuda.so` can be loaded instead of panicking inside cudarc's loader.
//!
//! Every call makes the device's primary context current on the calling thread first: the
//! allocator is called from whatever thread PyTorch (or the program) allocates on, and
//! PyTorch's runtime-API work uses the same primary context, so pointers are interchangeable.
//!
//! Physical memory for expandable segments is created in units of the device's allocation
//! granularity (2 MiB on current GPUs): the engine unmaps whole pages of its own page size (2 or
//! 20 MiB) inside earlier mappings, and `cuMemUnmap` must cover whole mappings, so the smallest
//! unit keeps every unmap legal. Access is set once per mapped range.

use super::Device;
use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why the CUDA device could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    #[error("no CUDA driver could be loaded (libcuda.so.1 not found): alloctrace needs an NVIDIA driver to record")]
    NoDriver,
    #[error("CUDA call {call} failed: {code}")]
    Call { call: &'static str, code: String },
    #[error("CUDA device {ordinal} does not exist ({count} devices)")]
    NoSuchDevice { ordinal: i32, count: i32 },
}

fn check(call: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Call { call, code: format!("{r:?}") })
    }
}

/// True when the driver library can be loaded (without loading cudarc's copy of it).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc would use.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// One CUDA device, through its primary context.
pub struct CudaDevice {
    ordinal: i32,
    ctx: sys::CUcontext,
    name: String,
    total_bytes: u64,
    granularity: u64,
    /// Physical handles of mapped memory, keyed by address, one per `granularity` bytes.
    handles: BTreeMap<u64, sys::CUmemGenericAllocationHandle>,
    /// Driver errors that were not "out of memory", in order (the first few are kept).
    errors: Vec<String>,
    error_count: u64,
}

// SAFETY: the context handle is a process-wide driver object; every use makes it current on the
// calling thread first, and the recorder serialises all calls to the device behind a lock.
unsafe impl Send for CudaDevice {}

const KEEP_ERRORS: usize = 16;

impl CudaDevice {
    /// Opens device `ordinal` (retaining its primary context, as the CUDA runtime does).
    pub fn new(ordinal: i32) -> Result<Self, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        // cudarc panics inside its loader when a symbol is missing; never let that unwind out.
        catch_unwind(AssertUnwindSafe(|| Self::open(ordinal))).unwrap_or(Err(CudaError::NoDriver))
    }

    fn open(ordinal: i32) -> Result<Self, CudaError> {
        // SAFETY: plain driver API calls with valid out-pointers.
        unsafe {
            check("cuInit", sys::cuInit(0))?;
            let mut count = 0;
            check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
            if ordinal < 0 || ordinal >= count {
                return Err(CudaError::NoSuchDevice { ordinal, count });
            }
            let mut dev = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
            let mut ctx = std::ptr::null_mut();
            check("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let mut buf = [0 as c_char; 256];
            check("cuDeviceGetName", sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev))?;
            let name = std::ffi::CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let mut total = 0usize;
            check("cuDeviceTotalMem", sys::cuDeviceTotalMem_v2(&mut total, dev))?;
            let prop = alloc_prop(ordinal);
            let mut gran = 0usize;
            check(
                "cuMemGetAllocationGranularity",
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
            )?;
            Ok(CudaDevice {
                ordinal,
                ctx,
                name,
                total_bytes: total as u64,
                granularity: (gran as u64).max(1),
                handles: BTreeMap::new(),
                errors: Vec::new(),
                error_count: 0,
            })
        }
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
    /// The VMM allocation granularity (physical memory is created in these units).
    pub fn granularity_bytes(&self) -> u64 {
        self.granularity
    }
    /// Driver errors other than "out of memory" (answered to the engine as out of memory):
    /// the first few messages, and how many there were.
    pub fn errors(&self) -> (&[String], u64) {
        (&self.errors, self.error_count)
    }

    #[inline]
    fn make_current(&mut self) {
        // SAFETY: valid out-pointer; the context was retained in `open`.
        unsafe {
            let mut cur = std::ptr::null_mut();
            if sys::cuCtxGetCurrent(&mut cur) != sys::CUresult::CUDA_SUCCESS || cur != self.ctx {
                let r = sys::cuCtxSetCurrent(self.ctx);
                self.note("cuCtxSetCurrent", r);
            }
        }
    }

    /// Records a failed call; true when it failed. Out of memory is not an error here.
    fn note(&mut self, call: &'static str, r: sys::CUresult) -> bool {
        if r == sys::CUresult::CUDA_SUCCESS {
            return false;
        }
        if r != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            self.error_count += 1;
            if self.errors.len() < KEEP_ERRORS {
                self.errors.push(format!("{call}: {r:?}"));
            }
        }
        true
    }

    /// Unmaps and releases the handles in `[addr, end)`.
    fn release_handles(&mut self, addr: u64, end: u64) {
        let keys: Vec<(u64, sys::CUmemGenericAllocationHandle)> =
            self.handles.range(addr..end).map(|(&a, &h)| (a, h)).collect();
        for (a, h) in keys {
            self.handles.remove(&a);
            // SAFETY: `a` was mapped with handle `h` of `granularity` bytes by `map`.
            unsafe {
                let r = sys::cuMemUnmap(a, self.granularity as usize);
                self.note("cuMemUnmap", r);
                let r = sys::cuMemRelease(h);
                self.note("cuMemRelease", r);
            }
        }
    }
}

fn alloc_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; all-zero is its documented default state.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

impl Device for CudaDevice {
    fn alloc_segment(&mut self, bytes: u64, _stream: u64) -> Option<u64> {
        self.make_current();
        let mut ptr = 0;
        // SAFETY: valid out-pointer, current context.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) };
        if self.note("cuMemAlloc", r) {
            return None;
        }
        Some(ptr)
    }

    fn free_segment(&mut self, addr: u64, _bytes: u64) {
        self.make_current();
        // SAFETY: `addr` came from `cuMemAlloc` and the engine frees each segment once.
        let r = unsafe { sys::cuMemFree_v2(addr) };
        self.note("cuMemFree", r);
    }

    fn reserve_address_space(&mut self, bytes: u64) -> Option<u64> {
        self.make_current();
        let bytes = bytes.div_ceil(self.granularity) * self.granularity;
        let mut ptr = 0;
        // SAFETY: valid out-pointer; size is a multiple of the granularity.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, 0, 0, 0) };
        if self.note("cuMemAddressReserve", r) {
            return None;
        }
        Some(ptr)
    }

    fn release_address_space(&mut self, addr: u64, bytes: u64) {
        self.make_current();
        let bytes = bytes.div_ceil(self.granularity) * self.granularity;
        // Anything still mapped in the range goes first (the engine unmaps before releasing).
        self.release_handles(addr, addr + bytes);
        // SAFETY: the range came from `reserve_address_space` with this size.
        let r = unsafe { sys::cuMemAddressFree(addr, bytes as usize) };
        self.note("cuMemAddressFree", r);
    }

    fn map(&mut self, addr: u64, bytes: u64, _stream: u64) -> bool {
        self.make_current();
        let g = self.granularity;
        let prop = alloc_prop(self.ordinal);
        let mut a = addr;
        while a < addr + bytes {
            let mut h = 0;
            // SAFETY: valid prop and out-pointer; `a` lies in a reserved range, unmapped.
            let ok = unsafe {
                let r = sys::cuMemCreate(&mut h, g as usize, &prop, 0);
                if self.note("cuMemCreate", r) {
                    false
                } else {
                    let r = sys::cuMemMap(a, g as usize, 0, h, 0);
                    if self.note("cuMemMap", r) {
                        let r = sys::cuMemRelease(h);
                        self.note("cuMemRelease", r);
                        false
                    } else {
                        true
                    }
                }
            };
            if !ok {
                self.release_handles(addr, a);
                return false;
            }
            self.handles.insert(a, h);
            a += g;
        }
        let mut desc: sys::CUmemAccessDesc = unsafe {
            // SAFETY: a plain C struct, filled in below.
            std::mem::zeroed()
        };
        desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = self.ordinal;
        desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the whole range was just mapped.
        let r = unsafe { sys::cuMemSetAccess(addr, (a - addr) as usize, &desc, 1) };
        if self.note("cuMemSetAccess", r) {
            self.release_handles(addr, a);
            return false;
        }
        true
    }

    fn unmap(&mut self, addr: u64, bytes: u64) {
        self.make_current();
        self.release_handles(addr, addr + bytes);
    }

    fn mem_info(&mut self) -> Option<(u64, u64)> {
        self.make_current();
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers, current context.
        let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        if self.note("cuMemGetInfo", r) {
            return None;
        }
        Some((free as u64, total as u64))
    }

    fn synchronize(&mut self) {
        self.make_current();
        // SAFETY: current context.
        let r = unsafe { sys::cuCtxSynchronize() };
        self.note("cuCtxSynchronize", r);
    }

    fn record_event(&mut self, stream: u64) -> Option<u64> {
        self.make_current();
        let mut ev = std::ptr::null_mut();
        // SAFETY: valid out-pointer, current context; `stream` is a live stream handle of this
        // context (PyTorch passes the stream of `record_stream`).
        unsafe {
            let r = sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32);
            if self.note("cuEventCreate", r) {
                return None;
            }
            let r = sys::cuEventRecord(ev, stream as sys::CUstream);
            if self.note("cuEventRecord", r) {
                let r = sys::cuEventDestroy_v2(ev);
                self.note("cuEventDestroy", r);
                return None;
            }
        }
        Some(ev as u64)
    }

    fn event_done(&mut self, event: u64) -> bool {
        self.make_current();
        // SAFETY: `event` came from `record_event` and is not destroyed yet.
        let r = unsafe { sys::cuEventQuery(event as sys::CUevent) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return false;
        }
        // An error other than "not ready" will not get better: count it and let the block go.
        self.note("cuEventQuery", r);
        true
    }

    fn wait_event(&mut self, event: u64) {
        self.make_current();
        // SAFETY: as in `event_done`.
        let r = unsafe { sys::cuEventSynchronize(event as sys::CUevent) };
        self.note("cuEventSynchronize", r);
    }

    fn destroy_event(&mut self, event: u64) {
        self.make_current();
        // SAFETY: as in `event_done`; destroyed once.
        let r = unsafe { sys::cuEventDestroy_v2(event as sys::CUevent) };
        self.note("cuEventDestroy", r);
    }
}
