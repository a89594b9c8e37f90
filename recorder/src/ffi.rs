//! The C ABI of the cdylib: PyTorch's `CUDAPluggableAllocator` entry points (the engine
//! back-end), the entry PyTorch's own allocator forwards its events to (the default back-end),
//! and a few calls to label and close the traces.
//!
//! ```c
//! // The engine back-end (alloctrace's allocator runs the job):
//! void* alloctrace_malloc(size_t size, int device, cudaStream_t stream);
//! void  alloctrace_free(void* ptr, size_t size, int device, cudaStream_t stream);
//! void  alloctrace_record_stream(void* ptr, cudaStream_t stream); // set_record_stream_fn
//! void  alloctrace_init(int device_count);    // set_init_fn (nothing: malloc starts the recorder)
//! void  alloctrace_empty_cache(void);         // set_reset_fn: torch.cuda.empty_cache()
//! // The default back-end (PyTorch's caching allocator runs the job, its trace tracker calls):
//! void  alloctrace_torch_event(int action, int device, uint64_t addr, uint64_t size, uint64_t stream,
//!                              uint64_t ticks, uint64_t pool_a, uint64_t pool_b);
//! void  alloctrace_torch_entry(int action, int device, uint64_t addr, uint64_t size, uint64_t stream);
//!                                             // the same without time and pool (first helper)
//! void  alloctrace_torch_event_at(int action, int device, uint64_t addr, uint64_t size, uint64_t stream,
//!                                 uint64_t ticks, uint64_t pool_a, uint64_t pool_b, uint32_t callsite);
//!                                             // with the allocation's call site (0: none), defined
//!                                             // later by alloctrace_define_callsite
//! void  alloctrace_define_callsite(uint32_t id, uint64_t n, const char* const* files,
//!                                  const uint32_t* lines, const char* const* functions);
//!                                             // n frames, innermost first (see recorder::sites)
//! // Both:
//! void  alloctrace_mark(const char* label);   // a phase
//! void  alloctrace_mark_iteration(const char* label);
//! int   alloctrace_set_capacity(int device, uint64_t bytes);
//!                                             // the limit the job ran past (default back-end;
//!                                             // 1 = in the header, 0 = set late: status file)
//! int   alloctrace_shutdown(void);            // flush, write the trailers; 0 = nothing lost
//!                                             // (also run at exit; 2 in a forked child)
//! unsigned long long alloctrace_dropped(void);
//! ```
//! One recorder per device a process uses, each with a trace of its own, started by the first
//! event for that device, configured from the environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `ALLOCTRACE_OUTPUT` | the trace's path (default `alloctrace.atrace`); see [`trace_path`] for ranks, devices and patterns |
//! | `ALLOCTRACE_CONF` | allocator settings, `PYTORCH_CUDA_ALLOC_CONF` syntax (default: what PyTorch reads from `PYTORCH_ALLOC_CONF` and `PYTORCH_CUDA_ALLOC_CONF`, see [`resolve_conf_env`]); settings that cannot be parsed are replaced by the defaults, with a warning; `per_process_memory_fraction` becomes the capacity |
//! | `ALLOCTRACE_TORCH_VERSION` | the program's `torch.__version__`: kept in the header; the engine follows that release's allocator (default 2.11) |
//! | `ALLOCTRACE_CAPACITY` | cap on reserved memory: bytes, or with a `KiB`/`MiB`/`GiB` suffix (0 or a bad value: ignored, with a warning). The engine back-end enforces it; the default back-end records it as the trace's capacity and PyTorch serves past it |
//! | `ALLOCTRACE_STACKS=1` | record Python call sites (interned stacks) of each allocation (engine back-end; the default back-end's helper passes PyTorch's own stacks) |
//! | `ALLOCTRACE_STATUS` | a folder: `alloctrace_shutdown` writes `status.<pid>.<device>` there, a `key=value` summary for the CLI (created new, never through a link) |
//! | `ALLOCTRACE_DEVICE=sim` | use the simulated device (tests without a GPU; pointers are fake) |
//! | `ALLOCTRACE_CLOCK=monotonic` | timestamps from `CLOCK_MONOTONIC`, not the time stamp counter |
//! | `RANK`, `LOCAL_RANK`, `WORLD_SIZE` | set by `torchrun`: kept in the header, and the rank names the trace |
//!
//! **Forks.** A forked child gets a copy of the recorders but not their writer threads: it
//! records nothing and never waits for a writer (`pthread_atfork` handlers hold every lock
//! across the fork, so the child's copies are consistent and unlocked). Its allocations work.
//!
//! **`record_stream`** (engine back-end). A block used on other streams than its own is freed
//! in two steps, as PyTorch does: `free_requested` at the free, an event recorded on each of
//! those streams, and `free_completed` (the block is reusable) once every event has completed,
//! checked at later allocations without waiting; an allocation that would fail first
//! waits for them.
//!
//! No panic crosses the ABI: every entry point runs under `catch_unwind` and answers null / does
//! nothing when something went wrong.

use crate::device::{Device, SimDevice};
use crate::engine::config::AllocatorConfig;
use crate::engine::version::{resolve_conf_env, TorchVersion};
use crate::recorder::lock::Lock;
use crate::recorder::sites::SiteTable;
use crate::recorder::{CallSite, Emit, RecordSummary, Recorder, RecorderOptions};
use crate::trace::{Event, Frame, MarkKind, Placement, Pool, ReleaseCause, NO_CALLSITE};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};

/// The device behind the C ABI: CUDA, or simulated for tests. One per recorder, so the size of
/// the simulated device's placement state (larger than CUDA's handle) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum AnyDevice {
    Sim(SimDevice),
    #[cfg(feature = "cuda")]
    Cuda(crate::device::cuda::CudaDevice),
}

macro_rules! each {
    ($self:ident, $d:ident => $e:expr) => {
        match $self {
            AnyDevice::Sim($d) => $e,
            #[cfg(feature = "cuda")]
            AnyDevice::Cuda($d) => $e,
        }
    };
}

impl Device for AnyDevice {
    fn alloc_segment(&mut self, bytes: u64, stream: u64) -> Option<u64> {
        each!(self, d => d.alloc_segment(bytes, stream))
    }
    fn free_segment(&mut self, addr: u64, bytes: u64) {
        each!(self, d => d.free_segment(addr, bytes))
    }
    fn reserve_address_space(&mut self, bytes: u64) -> Option<u64> {
        each!(self, d => d.reserve_address_space(bytes))
    }
    fn release_address_space(&mut self, addr: u64, bytes: u64) {
        each!(self, d => d.release_address_space(addr, bytes))
    }
    fn map(&mut self, addr: u64, bytes: u64, stream: u64) -> bool {
        each!(self, d => d.map(addr, bytes, stream))
    }
    fn unmap(&mut self, addr: u64, bytes: u64) {
        each!(self, d => d.unmap(addr, bytes))
    }
    fn mem_info(&mut self) -> Option<(u64, u64)> {
        each!(self, d => d.mem_info())
    }
    fn synchronize(&mut self) {
        each!(self, d => d.synchronize())
    }
    fn record_event(&mut self, stream: u64) -> Option<u64> {
        each!(self, d => d.record_event(stream))
    }
    fn event_done(&mut self, event: u64) -> bool {
        each!(self, d => d.event_done(event))
    }
    fn wait_event(&mut self, event: u64) {
        each!(self, d => d.wait_event(event))
    }
    fn destroy_event(&mut self, event: u64) {
        each!(self, d => d.destroy_event(event))
    }
}

/// Which allocator runs the job.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    /// alloctrace's engine (`CUDAPluggableAllocator`).
    Engine,
    /// PyTorch's caching allocator; its events are forwarded here.
    Torch,
}

struct Global {
    rec: Recorder<AnyDevice>,
    device: c_int,
    stacks: bool,
    /// The process that started the recorder (a forked child's copy must not close the trace).
    pid: u32,
    /// The default back-end: PyTorch's allocator runs the job, and the recorder keeps a
    /// [`TorchState`] (under its own lock, [`Recorder::with_state`]).
    torch: bool,
    /// PyTorch's trace entries carry time stamp counter readings this recorder's clock can use
    /// as they are (its clock is the counter).
    tsc: bool,
    summary: Mutex<Option<RecordSummary>>,
    /// A capacity the program set after this recorder had written its header
    /// ([`alloctrace_set_capacity`]); 0 = none. Reported in the status file, from which
    /// `alloctrace record` puts it in the header.
    late_capacity: AtomicU64,
}

/// The default back-end's call sites, resolved after their events by the helper's resolver
/// ([`alloctrace_define_callsite`]); shared by the traces of every device.
fn sites() -> &'static Arc<SiteTable> {
    static SITES: OnceLock<Arc<SiteTable>> = OnceLock::new();
    SITES.get_or_init(|| Arc::new(SiteTable::new()))
}

/// Capacities set through [`alloctrace_set_capacity`] before their device's recorder started.
static SET_CAPACITY: Mutex<Vec<(c_int, u64)>> = Mutex::new(Vec::new());

/// Devices a process may record (CUDA ordinals).
const MAX_DEVICES: usize = 64;

static GLOBALS: [OnceLock<Option<Global>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
/// True once a device's trace took the plain output name; later devices add `.dev{D}`.
static PRIMARY_TAKEN: AtomicBool = AtomicBool::new(false);
static FORK_HANDLERS: Once = Once::new();

/// Streams a live block was used on (`record_stream`), keyed by address; with a count so that
/// frees of blocks never recorded pay one atomic load.
static USES: Lock<Option<HashMap<u64, Vec<u64>>>> = Lock::new(None);
static USES_N: AtomicUsize = AtomicUsize::new(0);
/// Frees waiting for events on other streams.
static PENDING: Lock<Vec<PendingFree>> = Lock::new(Vec::new());
static PENDING_N: AtomicUsize = AtomicUsize::new(0);

struct PendingFree {
    device: c_int,
    addr: u64,
    events: Vec<u64>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_u32(name: &str) -> Option<u32> {
    env(name).and_then(|v| v.trim().parse().ok())
}

/// The placement of this process's trace of `device`: the device, and `torchrun`'s variables.
fn placement(device: c_int) -> Placement {
    Placement {
        device_index: u32::try_from(device).ok(),
        rank: env_u32("RANK"),
        local_rank: env_u32("LOCAL_RANK"),
        world_size: env_u32("WORLD_SIZE"),
    }
}

/// The trace of `device` in this process. `base` may hold `{rank}`, `{local_rank}`, `{device}`
/// and `{pid}` (unknown ranks read 0). Without a pattern, a process of a distributed job
/// (`RANK` set) writes `NAME.rank{R}.atrace`, and a process that records more than one device
/// writes the first device's trace under the name and each later one's under
/// `NAME[.rank{R}].dev{D}.atrace`: never two writers on one file.
pub fn trace_path(base: &str, p: &Placement, device: c_int, primary: bool) -> PathBuf {
    let num = |v: Option<u32>| v.unwrap_or(0).to_string();
    if base.contains('{') {
        let s = base
            .replace("{rank}", &num(p.rank))
            .replace("{local_rank}", &num(p.local_rank))
            .replace("{device}", &device.to_string())
            .replace("{pid}", &std::process::id().to_string());
        let mut path = PathBuf::from(s);
        if !base.contains("{device}") && !primary {
            path = with_suffix(&path, &format!("dev{device}"));
        }
        return path;
    }
    let mut path = PathBuf::from(base);
    if let Some(r) = p.rank {
        path = with_suffix(&path, &format!("rank{r}"));
    }
    if !primary {
        path = with_suffix(&path, &format!("dev{device}"));
    }
    path
}

/// `run.atrace` + `rank1` = `run.rank1.atrace`; a name without the extension gets the suffix
/// at its end.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let new = match name.strip_suffix(".atrace") {
        Some(stem) => format!("{stem}.{suffix}.atrace"),
        None => format!("{name}.{suffix}"),
    };
    path.with_file_name(new)
}

fn start(device: c_int, backend: Backend) -> Option<Global> {
    let base = env("ALLOCTRACE_OUTPUT").unwrap_or_else(|| "alloctrace.atrace".into());
    let place = placement(device);
    let primary = base.contains("{device}") || !PRIMARY_TAKEN.swap(true, Ordering::AcqRel);
    let mut opts = RecorderOptions::new(trace_path(&base, &place, device, primary));
    opts.torch_version = env("ALLOCTRACE_TORCH_VERSION").and_then(|v| match TorchVersion::parse(&v) {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("alloctrace: ignoring ALLOCTRACE_TORCH_VERSION: {e}");
            None
        }
    });
    // PyTorch's allocator runs under PyTorch's variables, whatever else is set.
    let torch_conf = || {
        resolve_conf_env(
            opts.torch_version.unwrap_or_default(),
            env("PYTORCH_ALLOC_CONF").as_deref(),
            env("PYTORCH_CUDA_ALLOC_CONF").as_deref(),
        )
    };
    let conf = match backend {
        Backend::Engine => env("ALLOCTRACE_CONF").unwrap_or_else(torch_conf),
        Backend::Torch => torch_conf(),
    };
    opts.alloc_conf = checked_conf(conf);
    // The default back-end: a limit the program set itself (its memory fraction, which the shim
    // lifts) else ALLOCTRACE_CAPACITY, recorded as the capacity; PyTorch serves past it.
    let set = SET_CAPACITY.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|c| c.0 == device).map(|c| c.1);
    if let Some(bytes) = set.filter(|_| backend == Backend::Torch) {
        opts.capacity_bytes = Some(bytes);
    } else if let Some(c) = env("ALLOCTRACE_CAPACITY") {
        match crate::engine::config::parse_bytes(&c) {
            Ok(0) => eprintln!(
                "alloctrace: ignoring ALLOCTRACE_CAPACITY=0 (a 0-byte limit fits nothing; unset it for no limit)"
            ),
            Ok(b) => opts.capacity_bytes = Some(b),
            Err(e) => eprintln!("alloctrace: ignoring ALLOCTRACE_CAPACITY: {e}"),
        }
    }
    let stacks = backend == Backend::Engine && env("ALLOCTRACE_STACKS").is_some_and(|v| v != "0");
    opts.command_line = std::env::args().collect();
    opts.use_tsc = env("ALLOCTRACE_CLOCK").as_deref() != Some("monotonic");
    opts.placement = place;
    if backend == Backend::Torch {
        opts.sites = Some(sites().clone());
    }
    opts.notes.push(match backend {
        Backend::Engine => format!("recorded through the C ABI (CUDAPluggableAllocator), device {device}"),
        Backend::Torch => format!(
            "PyTorch's caching allocator ran the job; its events were forwarded by its trace tracker, device {device} \
             (no split or merge events: a replay adds them)"
        ),
    });
    let mut dev = if env("ALLOCTRACE_DEVICE").as_deref() == Some("sim") {
        opts.notes.push("simulated device (ALLOCTRACE_DEVICE=sim)".into());
        AnyDevice::Sim(SimDevice::new(opts.capacity_bytes))
    } else {
        match open_cuda(device, &mut opts) {
            Ok(d) => d,
            Err(e) if backend == Backend::Torch => {
                // The device only names the header here: record without it.
                opts.notes.push(format!("device details unknown: {e}"));
                AnyDevice::Sim(SimDevice::new(None))
            }
            Err(e) => {
                eprintln!("alloctrace: cannot record: {e}");
                return None;
            }
        }
    };
    let config = AllocatorConfig::parse(&opts.alloc_conf).unwrap_or_default();
    if opts.capacity_bytes.is_none() {
        // per_process_memory_fraction: the cap PyTorch computes from the device's total.
        let total = dev.mem_info().map(|(_, t)| t).unwrap_or(opts.device_total_bytes);
        if let (Some(f), true) = (config.memory_fraction(), total > 0) {
            opts.capacity_bytes = opts.torch_version.unwrap_or_default().fraction_cap(f, total);
        }
    }
    match Recorder::start(opts, dev) {
        Ok(rec) => {
            // Close the trace at exit even when the program never calls alloctrace_shutdown.
            // SAFETY: registers functions with no captured state; atexit and pthread_atfork
            // are thread-safe.
            FORK_HANDLERS.call_once(|| unsafe {
                atexit(shutdown_at_exit);
                pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child));
            });
            let torch = backend == Backend::Torch;
            if torch {
                rec.set_state(Box::new(TorchState::new(config)));
            }
            let tsc = rec.clock_source() == crate::recorder::ClockSource::Tsc;
            Some(Global {
                rec,
                device,
                stacks,
                pid: std::process::id(),
                torch,
                tsc,
                summary: Mutex::new(None),
                late_capacity: AtomicU64::new(0),
            })
        }
        Err(e) => {
            eprintln!("alloctrace: cannot record: {e}");
            None
        }
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
}

extern "C" fn shutdown_at_exit() {
    let _ = alloctrace_shutdown();
}

fn started() -> impl Iterator<Item = &'static Global> {
    GLOBALS.iter().filter_map(|g| g.get().and_then(|g| g.as_ref()))
}

/// `pthread_atfork` prepare: every lock taken (the side tables first, as everywhere), so that
/// no thread is inside a critical section when the process is copied.
extern "C" fn before_fork() {
    USES.lock_and_keep();
    PENDING.lock_and_keep();
    for g in started() {
        g.rec.before_fork();
    }
}

extern "C" fn after_fork_in_parent() {
    // SAFETY: `before_fork` kept each of these locks, in this order.
    unsafe {
        for g in started() {
            g.rec.after_fork_in_parent();
        }
        PENDING.force_unlock(|_| {});
        USES.force_unlock(|_| {});
    }
}

extern "C" fn after_fork_in_child() {
    // SAFETY: as in the parent; the child's copies of the locks are held by `before_fork`.
    unsafe {
        for g in started() {
            g.rec.after_fork_in_child();
        }
        // The parent's pending frees wait on the parent's streams: not the child's business.
        PENDING.force_unlock(|p| p.clear());
        PENDING_N.store(0, Ordering::Relaxed);
        USES.force_unlock(|_| {});
    }
}

/// Allocator settings from the environment that the engine can run: a string it cannot parse is
/// replaced by the defaults (a recorder that refuses to start would fail every allocation, and
/// PyTorch would report that as out of memory), and a key that is no allocator setting is
/// pointed out. Both are said on stderr.
fn checked_conf(conf: String) -> String {
    match AllocatorConfig::parse(&conf) {
        Ok(c) => {
            if let Err(e) = c.check_user_keys() {
                eprintln!("alloctrace: allocator settings `{conf}`: {e}; it changes nothing here");
            }
            conf
        }
        Err(e) => {
            eprintln!("alloctrace: {e}; recording with the default settings");
            String::new()
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(device: c_int, opts: &mut RecorderOptions) -> Result<AnyDevice, String> {
    let d = crate::device::cuda::CudaDevice::new(device).map_err(|e| e.to_string())?;
    opts.device_name = d.name().to_string();
    opts.device_total_bytes = d.total_bytes();
    Ok(AnyDevice::Cuda(d))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_device: c_int, _opts: &mut RecorderOptions) -> Result<AnyDevice, String> {
    Err("this build of alloctrace has no CUDA support (built without the `cuda` feature)".into())
}

#[inline]
fn global(device: c_int, backend: Backend) -> Option<&'static Global> {
    let slot = GLOBALS.get(usize::try_from(device).ok()?)?;
    slot.get_or_init(|| start(device, backend)).as_ref()
}

#[inline]
fn started_global(device: c_int) -> Option<&'static Global> {
    GLOBALS.get(usize::try_from(device).ok()?)?.get()?.as_ref()
}

/// PyTorch's `set_init_fn`, called with the number of devices. Each device's recorder starts
/// at its first allocation instead.
#[no_mangle]
pub extern "C" fn alloctrace_init(_device_count: c_int) {}

/// `CUDAPluggableAllocator` malloc: a block of `size` bytes on `stream`; null when out of memory.
#[no_mangle]
pub extern "C" fn alloctrace_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        let g = global(device, Backend::Engine)?;
        if size == 0 {
            return None;
        }
        if PENDING_N.load(Ordering::Relaxed) > 0 {
            complete_pending(g, false);
        }
        let site = if g.stacks { pystack::current(&g.rec) } else { CallSite::NONE };
        match g.rec.malloc_at(size as u64, stream as u64, site) {
            Ok(a) => Some(a.addr as *mut c_void),
            // Blocks waiting for other streams' work may be all that is missing: wait for
            // them, as PyTorch does before giving up.
            Err(_) if PENDING_N.load(Ordering::Relaxed) > 0 && complete_pending(g, true) > 0 => {
                g.rec.malloc_at(size as u64, stream as u64, site).ok().map(|a| a.addr as *mut c_void)
            }
            Err(_) => None,
        }
    }))
    .ok()
    .flatten()
    .unwrap_or(std::ptr::null_mut())
}

/// `CUDAPluggableAllocator` free.
#[no_mangle]
pub extern "C" fn alloctrace_free(ptr: *mut c_void, _size: usize, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(g) = started_global(device) else { return };
        let addr = ptr as u64;
        let mut used_on = if USES_N.load(Ordering::Relaxed) > 0 { take_uses(addr) } else { Vec::new() };
        used_on.retain(|&s| s != stream as u64);
        if used_on.is_empty() {
            let _ = g.rec.free(addr);
        } else {
            defer_free(g, addr, &used_on);
        }
    }));
}

/// `set_record_stream_fn`: the block at `ptr` is used on `stream` too; its free waits for the
/// work queued there until then.
#[no_mangle]
pub extern "C" fn alloctrace_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut uses = USES.lock();
        let streams = uses.get_or_insert_with(HashMap::new).entry(ptr as u64).or_default();
        if !streams.contains(&(stream as u64)) {
            streams.push(stream as u64);
        }
        USES_N.store(uses.as_ref().map_or(0, HashMap::len), Ordering::Relaxed);
    }));
}

fn take_uses(addr: u64) -> Vec<u64> {
    let mut uses = USES.lock();
    let Some(map) = uses.as_mut() else { return Vec::new() };
    let streams = map.remove(&addr).unwrap_or_default();
    USES_N.store(map.len(), Ordering::Relaxed);
    streams
}

/// The first half of a free whose block other streams still use: `free_requested` now, and
/// an event on each of those streams; [`complete_pending`] does the rest.
fn defer_free(g: &Global, addr: u64, streams: &[u64]) {
    if g.rec.free_requested(addr).is_err() {
        return; // an unknown pointer: counted by the recorder
    }
    let mut events = Vec::with_capacity(streams.len());
    let recorded = g.rec.with_device(|d| {
        for &s in streams {
            match d.record_event(s) {
                Some(e) => events.push(e),
                None => return false,
            }
        }
        true
    });
    if !recorded {
        // No event could be made: wait for the device, then the block is free.
        g.rec.with_device(|d| {
            events.iter().for_each(|&e| d.destroy_event(e));
            d.synchronize();
        });
        let _ = g.rec.free_completed(addr);
        return;
    }
    let mut p = PENDING.lock();
    p.push(PendingFree { device: g.device, addr, events });
    PENDING_N.store(p.len(), Ordering::Relaxed);
}

/// Completes the pending frees of `g`'s device whose events are done (`wait`: waits for all
/// of them first). Returns how many completed.
fn complete_pending(g: &Global, wait: bool) -> usize {
    let done: Vec<PendingFree> = {
        let mut p = PENDING.lock();
        let mut done = Vec::new();
        let mut i = 0;
        while i < p.len() {
            let ready = p[i].device == g.device
                && g.rec.with_device(|d| {
                    p[i].events.iter().all(|&e| {
                        if wait {
                            d.wait_event(e);
                        }
                        d.event_done(e)
                    })
                });
            if ready {
                done.push(p.swap_remove(i));
            } else {
                i += 1;
            }
        }
        PENDING_N.store(p.len(), Ordering::Relaxed);
        done
    };
    for f in &done {
        g.rec.with_device(|d| f.events.iter().for_each(|&e| d.destroy_event(e)));
        let _ = g.rec.free_completed(f.addr);
    }
    done.len()
}

/// `torch.cuda.empty_cache()` (PyTorch's `set_reset_fn`): every device's cache.
#[no_mangle]
pub extern "C" fn alloctrace_empty_cache() {
    let _ = catch_unwind(|| {
        for g in started() {
            if !g.torch {
                complete_pending(g, true);
                g.rec.empty_cache();
            }
        }
    });
}

/// What the default back-end knows of PyTorch's allocator, to turn its trace entries into
/// events: the ids of live blocks, segment pools, reserved and allocated bytes (for an OOM),
/// and the release burst in progress (PyTorch does not trace `empty_cache()`: a run of segment
/// frees is one [`Event::CacheRelease`], of cause `OomRetry` when an OOM follows it). Kept
/// under the recorder's lock ([`Recorder::with_state`]).
struct TorchState {
    config: AllocatorConfig,
    live: AddrMap<(u64, u64)>,
    next_id: u64,
    segment_pools: AddrMap<Pool>,
    reserved: u64,
    allocated: u64,
    burst: Option<(u64, u32)>,
}

impl TorchState {
    fn new(config: AllocatorConfig) -> Self {
        TorchState {
            config,
            live: AddrMap::default(),
            next_id: 0,
            segment_pools: AddrMap::default(),
            reserved: 0,
            allocated: 0,
            burst: None,
        }
    }
}

/// A map keyed by device address, hashed with [`AddrHasher`].
type AddrMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<AddrHasher>>;

/// Hashes a device address with one folded multiply (a few cycles; SipHash, the default, costs
/// tens of nanoseconds, paid on every event). Addresses come from the allocator, not from an
/// adversary, so a keyed hash buys nothing here.
#[derive(Default)]
struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        let m = u128::from(x ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The actions of PyTorch's trace entries, as `alloctrace_torch_entry` numbers them.
pub mod torch_action {
    pub const ALLOC: i32 = 0;
    pub const FREE_REQUESTED: i32 = 1;
    pub const FREE_COMPLETED: i32 = 2;
    pub const SEGMENT_ALLOC: i32 = 3;
    pub const SEGMENT_FREE: i32 = 4;
    pub const SEGMENT_MAP: i32 = 5;
    pub const SEGMENT_UNMAP: i32 = 6;
    pub const SNAPSHOT: i32 = 7;
    pub const OOM: i32 = 8;
}

/// A block's pool as PyTorch chooses it: small for requests of at most 1 MiB (rounded to 512).
fn request_pool(bytes: u64) -> Pool {
    if bytes.div_ceil(512).saturating_mul(512) <= crate::engine::config::SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// A segment's pool: small segments are exactly 2 MiB; a mapped range that is a whole number of
/// large pages is large.
fn segment_pool(st: &TorchState, bytes: u64, expandable: bool) -> Pool {
    if expandable {
        let large = st.config.large_segment_size.max(1);
        if bytes.is_multiple_of(large) {
            Pool::Large
        } else {
            Pool::Small
        }
    } else if bytes == crate::engine::config::SMALL_BUFFER {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The default back-end: one entry of PyTorch's allocator trace (`TraceEntry`), forwarded by
/// the trace tracker of alloctrace's PyTorch helper as it happens. `action` numbers:
/// [`torch_action`]. For an OOM, `addr` is the device's free memory and `size` the request.
/// `ticks`: the time stamp counter reading PyTorch took for the entry
/// (`c10::getApproximateTime`), used as the event's time where this recorder's clock is that
/// counter; 0 = not a counter reading (the recorder reads its clock). `pool_a`, `pool_b`: the
/// entry's memory pool (`MempoolId_t`), (0, 0) for the default pools.
///
/// The hot path of the default back-end: one lock (the recorder's, which also guards the
/// [`TorchState`]), no clock read where PyTorch's reading serves, one hash lookup.
#[no_mangle]
pub extern "C" fn alloctrace_torch_event(
    action: c_int,
    device: c_int,
    addr: u64,
    size: u64,
    stream: u64,
    ticks: u64,
    pool_a: u64,
    pool_b: u64,
) {
    alloctrace_torch_event_at(action, device, addr, size, stream, ticks, pool_a, pool_b, NO_CALLSITE);
}

/// [`alloctrace_torch_event`] with the allocation's call site: an id the helper gave PyTorch's
/// stack of this allocation (the same stack, the same id; 0 = none), which
/// [`alloctrace_define_callsite`] defines once resolved, outside PyTorch's lock. The trace
/// writer writes each definition before the first event that uses it
/// ([`crate::recorder::sites`]).
#[allow(clippy::too_many_arguments)]
#[no_mangle]
pub extern "C" fn alloctrace_torch_event_at(
    action: c_int,
    device: c_int,
    addr: u64,
    size: u64,
    stream: u64,
    ticks: u64,
    pool_a: u64,
    pool_b: u64,
    callsite: u32,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(g) = global(device, Backend::Torch) else { return };
        let ticks = (g.tsc && ticks != 0).then_some(ticks);
        g.rec.with_state(ticks, |st: &mut TorchState, out| {
            torch_entry(st, out, action, addr, size, stream, [pool_a, pool_b], callsite);
        });
    }));
}

/// Defines call site `id`: `n` frames, innermost first, each a file, a line and a function
/// (NUL-terminated strings; null reads as empty). `n` = 0: `id` could not be resolved and
/// names no call site. Called by the helper's resolver, which holds
/// the GIL and never PyTorch's allocator lock; it takes only the call-site table's lock. The
/// recorder's own frames (its Python shim) are left out.
#[no_mangle]
pub extern "C" fn alloctrace_define_callsite(
    id: u32,
    n: u64,
    files: *const *const c_char,
    lines: *const u32,
    functions: *const *const c_char,
) {
    let _ = catch_unwind(|| define_callsite(id, n, files, lines, functions));
}

fn define_callsite(id: u32, n: u64, files: *const *const c_char, lines: *const u32, functions: *const *const c_char) {
    if n == 0 || files.is_null() || lines.is_null() || functions.is_null() {
        // Nothing to name it with: writers stop waiting for it.
        sites().define(id, Vec::new());
        return;
    }
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the caller passes NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let frames = (0..n as usize)
        .map(|k| {
            // SAFETY: the caller passes `n` elements in each array.
            let (file, line, function) = unsafe { (*files.add(k), *lines.add(k), *functions.add(k)) };
            Frame { file: text(file), line, function: text(function) }
        })
        .collect();
    sites().define(id, frames);
}

/// [`alloctrace_torch_event`] without PyTorch's time and pool (the first helper's entry).
#[no_mangle]
pub extern "C" fn alloctrace_torch_entry(action: c_int, device: c_int, addr: u64, size: u64, stream: u64) {
    alloctrace_torch_event(action, device, addr, size, stream, 0, 0, 0);
}

#[allow(clippy::too_many_arguments)]
fn torch_entry(
    st: &mut TorchState,
    out: &mut Emit<'_>,
    action: c_int,
    addr: u64,
    size: u64,
    stream: u64,
    pool_id: [u64; 2],
    callsite: u32,
) {
    use torch_action::*;
    if !matches!(action, SEGMENT_FREE | SEGMENT_UNMAP) {
        if let Some((bytes, segments)) = st.burst.take() {
            let cause = if action == OOM { ReleaseCause::OomRetry } else { ReleaseCause::EmptyCache };
            out.event(Event::CacheRelease { cause, bytes, segments });
        }
    }
    match action {
        ALLOC => {
            st.next_id += 1;
            let id = st.next_id;
            let rounded = crate::engine::round_size(&st.config, size);
            st.live.insert(addr, (id, rounded));
            st.allocated = st.allocated.saturating_add(rounded);
            let pool = request_pool(size);
            out.event(Event::Alloc { id, addr, requested_bytes: size, block_bytes: 0, stream, pool, callsite });
        }
        FREE_REQUESTED => {
            if let Some(&(id, rounded)) = st.live.get(&addr) {
                st.allocated = st.allocated.saturating_sub(rounded);
                out.event(Event::FreeRequested { id, addr, callsite: NO_CALLSITE });
            }
        }
        FREE_COMPLETED => {
            if let Some((id, _)) = st.live.remove(&addr) {
                out.event(Event::FreeCompleted { id, addr });
            }
        }
        SEGMENT_ALLOC => {
            let pool = segment_pool(st, size, false);
            st.segment_pools.insert(addr, pool);
            st.reserved = st.reserved.saturating_add(size);
            out.event(Event::SegmentAlloc { addr, bytes: size, stream, pool });
            if pool_id != [0, 0] {
                out.event(Event::SegmentPool { addr, pool_id });
            }
        }
        SEGMENT_MAP => {
            let pool = segment_pool(st, size, true);
            st.reserved = st.reserved.saturating_add(size);
            out.event(Event::SegmentMap { addr, bytes: size, stream, pool });
            if pool_id != [0, 0] {
                out.event(Event::SegmentPool { addr, pool_id });
            }
        }
        SEGMENT_FREE | SEGMENT_UNMAP => {
            st.reserved = st.reserved.saturating_sub(size);
            let event = if action == SEGMENT_FREE {
                let pool = st.segment_pools.remove(&addr).unwrap_or_else(|| segment_pool(st, size, false));
                Event::SegmentFree { addr, bytes: size, stream, pool }
            } else {
                Event::SegmentUnmap { addr, bytes: size, stream, pool: segment_pool(st, size, true) }
            };
            out.event(event);
            let b = st.burst.get_or_insert((0, 0));
            b.0 = b.0.saturating_add(size);
            b.1 += u32::from(action == SEGMENT_FREE);
        }
        SNAPSHOT => {}
        OOM => out.event(Event::Oom {
            requested_bytes: size,
            alloc_bytes: size,
            device_free_bytes: addr,
            reserved_bytes: st.reserved,
            allocated_bytes: st.allocated,
            limit_bytes: 0,
            stream,
        }),
        _ => {}
    }
}

fn mark(kind: MarkKind, label: *const c_char) {
    if label.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(label) }.to_string_lossy();
        for g in started() {
            g.rec.mark(kind, &text);
        }
    }));
}

/// Labels a phase of the program (in the trace of every device it records).
#[no_mangle]
pub extern "C" fn alloctrace_mark(label: *const c_char) {
    mark(MarkKind::Phase, label);
}

/// Labels the start of an iteration.
#[no_mangle]
pub extern "C" fn alloctrace_mark_iteration(label: *const c_char) {
    mark(MarkKind::Iteration, label);
}

/// The memory limit the program would have run under on `device` (its memory fraction as
/// bytes, which the default back-end's shim lifts so that PyTorch serves past it), recorded as
/// the trace's capacity. Returns 1 when the header will hold it (set before the device's first
/// allocation), 0 when the header was already written: the status file then reports it as
/// `late_capacity`, and `alloctrace record` rewrites the header. A later call replaces an
/// earlier one; 0 bytes is ignored (returns -1).
#[no_mangle]
pub extern "C" fn alloctrace_set_capacity(device: c_int, bytes: u64) -> c_int {
    catch_unwind(|| {
        if bytes == 0 {
            return -1;
        }
        if let Some(g) = started_global(device) {
            g.late_capacity.store(bytes, Ordering::Relaxed);
            return 0;
        }
        let mut set = SET_CAPACITY.lock().unwrap_or_else(|e| e.into_inner());
        set.retain(|c| c.0 != device);
        set.push((device, bytes));
        1
    })
    .unwrap_or(-1)
}

/// Events dropped so far, over every device (0 before a recorder started): events that did not
/// reach the queue, and events whose chunk did not reach the file. After
/// [`alloctrace_shutdown`], the exact count the status file gives (what the file holds).
#[no_mangle]
pub extern "C" fn alloctrace_dropped() -> u64 {
    catch_unwind(|| {
        started()
            .map(|g| match g.summary.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                Some(s) => s.writer.events_dropped,
                None => g.rec.dropped_events(),
            })
            .sum()
    })
    .unwrap_or(0)
}

/// Writes the last events and the trailer of every device's trace. Returns 0 when every event
/// reached the traces, 1 when some were dropped or writing failed, 2 when no recorder ran (or
/// in a forked child). Idempotent: later calls return the first result. Allocations keep
/// working afterwards (unrecorded).
#[no_mangle]
pub extern "C" fn alloctrace_shutdown() -> c_int {
    catch_unwind(|| {
        // No call site comes after this: the writers stop waiting for them.
        sites().close();
        let mut result = 2;
        for g in started() {
            if g.pid != std::process::id() {
                return 2; // a forked child: the traces are the parent's to close
            }
            let mut slot = g.summary.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                if !g.torch {
                    complete_pending(g, true);
                }
                let s = g.rec.finish();
                if let Some(dir) = env("ALLOCTRACE_STATUS") {
                    write_status(Path::new(&dir), g.device, &status_text(&s, g));
                }
                *slot = Some(s);
            }
            let w = slot.as_ref().map(|s| s.writer.clone()).unwrap_or_default();
            let lost = w.events_dropped > 0 || w.error.is_some() || !w.complete;
            result = if lost { 1 } else { result.min(0) };
        }
        result
    })
    .unwrap_or(1)
}

/// Writes `text` to a new file in the status folder `dir` (`status.<pid>.<device>`): created
/// new with mode 0600, so a link planted there is never followed and nothing is overwritten.
fn write_status(dir: &Path, device: c_int, text: &str) {
    use std::io::Write;
    let path = dir.join(format!("status.{}.{device}", std::process::id()));
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    match o.open(&path) {
        Ok(mut f) => {
            let _ = f.write_all(text.as_bytes());
        }
        Err(e) => eprintln!("alloctrace: cannot write the status file {}: {e}", path.display()),
    }
}

fn status_text(s: &RecordSummary, g: &Global) -> String {
    #[allow(unused_mut)]
    let mut device_errors = String::new();
    #[cfg(feature = "cuda")]
    g.rec.with_device(|d| {
        if let AnyDevice::Cuda(c) = d {
            let (msgs, n) = c.errors();
            if n > 0 {
                device_errors = format!("{n} ({})", msgs.join("; "));
            }
        }
    });
    let w = &s.writer;
    let p = placement(g.device);
    let opt = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_default();
    format!(
        "path={}\ndevice={}\nrank={}\nevents={}\nevents_written={}\nevents_dropped={}\ntrace_bytes={}\ncomplete={}\nerror={}\nfree_errors={}\ndevice_errors={}\nwaited_ns={}\nlate_capacity={}\ncallsites_unresolved={}\n",
        s.path.display(),
        g.device,
        opt(p.rank),
        s.events,
        w.events_written,
        w.events_dropped,
        w.trace_bytes,
        w.complete,
        w.error.as_deref().unwrap_or(""),
        s.free_errors,
        device_errors,
        s.waited_ns,
        g.late_capacity.load(Ordering::Relaxed),
        w.callsites_unresolved
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_paths_per_rank_device_and_pattern() {
        let none = Placement::default();
        let r1 = Placement { rank: Some(1), local_rank: Some(1), world_size: Some(2), device_index: Some(1) };
        let p = |base: &str, pl: &Placement, d: c_int, primary: bool| trace_path(base, pl, d, primary);
        assert_eq!(p("run.atrace", &none, 0, true), PathBuf::from("run.atrace"));
        assert_eq!(p("out/run.atrace", &r1, 1, true), PathBuf::from("out/run.rank1.atrace"));
        assert_eq!(p("out/run.atrace", &r1, 3, false), PathBuf::from("out/run.rank1.dev3.atrace"));
        assert_eq!(p("run.atrace", &none, 2, false), PathBuf::from("run.dev2.atrace"));
        assert_eq!(p("run", &r1, 1, true), PathBuf::from("run.rank1"));
        assert_eq!(p("t/{rank}-{local_rank}-gpu{device}.atrace", &r1, 1, true), PathBuf::from("t/1-1-gpu1.atrace"));
        assert_eq!(p("t/r{rank}.atrace", &r1, 2, false), PathBuf::from("t/r1.dev2.atrace"));
        assert_eq!(p("t/r{rank}.atrace", &none, 0, true), PathBuf::from("t/r0.atrace"));
    }
}

/// Python call sites for `ALLOCTRACE_STACKS=1`, read through CPython's C API found with
/// `dlsym` in the running process (nothing is linked; outside Python there are no stacks).
///
/// PyTorch's bindings release the GIL around an operator, so the stack is read under
/// `PyGILState_Ensure`, and only on threads Python knows (`PyGILState_GetThisThreadState`):
/// C++ threads never touch the interpreter. Each frame is keyed by (code object, line); a
/// thread-local cache maps a stack of keys to its interned call site, so file and function
/// names are only read the first time a stack is seen.
mod pystack {
    use super::{CallSite, Recorder};
    use crate::trace::Frame;
    use std::collections::HashMap;
    use std::ffi::{c_char, c_int, c_void, CStr};
    use std::sync::OnceLock;

    const MAX_FRAMES: usize = 16;
    type Obj = *mut c_void;

    struct Api {
        get_this_thread_state: unsafe extern "C" fn() -> *mut c_void,
        ensure: unsafe extern "C" fn() -> c_int,
        release: unsafe extern "C" fn(c_int),
        get_frame: unsafe extern "C" fn() -> Obj,
        get_back: unsafe extern "C" fn(Obj) -> Obj,
        get_code: unsafe extern "C" fn(Obj) -> Obj,
        get_line: unsafe extern "C" fn(Obj) -> c_int,
        decref: unsafe extern "C" fn(Obj),
        getattr: unsafe extern "C" fn(Obj, *const c_char) -> Obj,
        as_utf8: unsafe extern "C" fn(Obj) -> *const c_char,
        err_clear: unsafe extern "C" fn(),
    }

    extern "C" {
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }

    fn api() -> Option<&'static Api> {
        static API: OnceLock<Option<Api>> = OnceLock::new();
        API.get_or_init(|| {
            // SAFETY: RTLD_DEFAULT (null on glibc) searches the running process; each symbol is
            // a CPython API function with the signature given to it.
            unsafe {
                macro_rules! sym {
                    ($name:literal, $t:ty) => {{
                        let p = dlsym(std::ptr::null_mut(), concat!($name, "\0").as_ptr() as *const c_char);
                        if p.is_null() {
                            return None;
                        }
                        std::mem::transmute::<*mut c_void, $t>(p)
                    }};
                }
                Some(Api {
                    get_this_thread_state: sym!("PyGILState_GetThisThreadState", unsafe extern "C" fn() -> *mut c_void),
                    ensure: sym!("PyGILState_Ensure", unsafe extern "C" fn() -> c_int),
                    release: sym!("PyGILState_Release", unsafe extern "C" fn(c_int)),
                    get_frame: sym!("PyEval_GetFrame", unsafe extern "C" fn() -> Obj),
                    get_back: sym!("PyFrame_GetBack", unsafe extern "C" fn(Obj) -> Obj),
                    get_code: sym!("PyFrame_GetCode", unsafe extern "C" fn(Obj) -> Obj),
                    get_line: sym!("PyFrame_GetLineNumber", unsafe extern "C" fn(Obj) -> c_int),
                    decref: sym!("Py_DecRef", unsafe extern "C" fn(Obj)),
                    getattr: sym!("PyObject_GetAttrString", unsafe extern "C" fn(Obj, *const c_char) -> Obj),
                    as_utf8: sym!("PyUnicode_AsUTF8", unsafe extern "C" fn(Obj) -> *const c_char),
                    err_clear: sym!("PyErr_Clear", unsafe extern "C" fn()),
                })
            }
        })
        .as_ref()
    }

    thread_local! {
        static CACHE: std::cell::RefCell<HashMap<Vec<(usize, i32)>, CallSite>> = Default::default();
    }

    /// The interned call site of the calling Python thread's stack; none outside Python.
    pub fn current<D: crate::device::Device + Send + 'static>(rec: &Recorder<D>) -> CallSite {
        let Some(api) = api() else {
            return CallSite::NONE;
        };
        // SAFETY: CPython API calls made while holding the GIL (PyGILState_Ensure), on a thread
        // that has a Python thread state; every new reference is released.
        unsafe {
            if (api.get_this_thread_state)().is_null() {
                return CallSite::NONE;
            }
            let gil = (api.ensure)();
            let mut keys = Vec::with_capacity(MAX_FRAMES);
            let mut frames_held: Vec<Obj> = Vec::with_capacity(MAX_FRAMES);
            let mut f = (api.get_frame)(); // borrowed
            while !f.is_null() && keys.len() < MAX_FRAMES {
                let code = (api.get_code)(f);
                keys.push((code as usize, (api.get_line)(f)));
                (api.decref)(code);
                let back = (api.get_back)(f); // new reference
                frames_held.push(back);
                f = back;
            }
            let site = CACHE.with(|c| c.borrow().get(&keys).copied());
            let site = match site {
                Some(s) => s,
                None => {
                    let mut frames = Vec::with_capacity(keys.len());
                    let mut f = (api.get_frame)();
                    let mut i = 0;
                    while !f.is_null() && i < keys.len() {
                        let code = (api.get_code)(f);
                        frames.push(Frame {
                            file: attr_str(api, code, c"co_filename"),
                            line: keys[i].1.max(0) as u32,
                            function: attr_str(api, code, c"co_qualname"),
                        });
                        (api.decref)(code);
                        f = frames_held[i];
                        i += 1;
                    }
                    let s = rec.callsite(frames);
                    CACHE.with(|c| c.borrow_mut().insert(keys, s));
                    s
                }
            };
            for b in frames_held {
                if !b.is_null() {
                    (api.decref)(b);
                }
            }
            (api.release)(gil);
            site
        }
    }

    /// `getattr(obj, name)` as a Rust string; empty on any failure.
    unsafe fn attr_str(api: &Api, obj: Obj, name: &CStr) -> String {
        // SAFETY: the caller holds the GIL and `obj` is a live object.
        unsafe {
            let v = (api.getattr)(obj, name.as_ptr());
            if v.is_null() {
                (api.err_clear)();
                return String::new();
            }
            let p = (api.as_utf8)(v);
            if p.is_null() {
                (api.err_clear)();
            }
            let s = if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() };
            (api.decref)(v);
            s
        }
    }
}
