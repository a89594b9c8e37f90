//! The C ABI of the cdylib: PyTorch's `CUDAPluggableAllocator` entry points and a few calls to
//! label and close the trace.
//!
//! ```c
//! void* alloctrace_malloc(size_t size, int device, cudaStream_t stream);
//! void  alloctrace_free(void* ptr, size_t size, int device, cudaStream_t stream);
//! void  alloctrace_init(int device_count);    // set_init_fn (nothing: malloc starts the recorder)
//! void  alloctrace_empty_cache(void);         // set_reset_fn: torch.cuda.empty_cache()
//! void  alloctrace_mark(const char* label);   // a phase
//! void  alloctrace_mark_iteration(const char* label);
//! int   alloctrace_shutdown(void);            // flush, write the trailer; 0 = nothing lost
//!                                             // (also run at exit; 2 in a forked child)
//! unsigned long long alloctrace_dropped(void);
//! ```
//! One recorder per process, for the first device it is asked for (allocations for another
//! device fail with a message: multi-GPU processes are not supported yet). It starts on the
//! first allocation (marks and cache releases before it are not recorded), configured from the
//! environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `ALLOCTRACE_OUTPUT` | the trace's path (default `alloctrace.atrace`) |
//! | `ALLOCTRACE_CONF` | allocator settings, `PYTORCH_CUDA_ALLOC_CONF` syntax (default: that variable); settings that cannot be parsed are replaced by the defaults, with a warning |
//! | `ALLOCTRACE_CAPACITY` | cap on reserved memory: bytes, or with a `KiB`/`MiB`/`GiB` suffix (0 or a bad value: ignored, with a warning) |
//! | `ALLOCTRACE_STACKS=1` | record Python call sites (interned stacks) of each allocation |
//! | `ALLOCTRACE_STATUS` | where `alloctrace_shutdown` writes a `key=value` summary (for the CLI) |
//! | `ALLOCTRACE_DEVICE=sim` | use the simulated device (tests without a GPU; pointers are fake) |
//! | `ALLOCTRACE_CLOCK=monotonic` | timestamps from `CLOCK_MONOTONIC`, not the time stamp counter |
//!
//! No panic crosses the ABI: every entry point runs under `catch_unwind` and answers null / does
//! nothing when something went wrong.

use crate::device::{Device, SimDevice};
use crate::recorder::{CallSite, RecordSummary, Recorder, RecorderOptions};
use crate::trace::MarkKind;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The device behind the C ABI: CUDA, or simulated for tests.
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
}

struct Global {
    rec: Recorder<AnyDevice>,
    device: c_int,
    stacks: bool,
    /// The process that started the recorder: a forked child has its memory but not its writer
    /// thread, so it must not close the parent's trace.
    pid: u32,
}

static GLOBAL: OnceLock<Option<Global>> = OnceLock::new();
static SUMMARY: Mutex<Option<RecordSummary>> = Mutex::new(None);
static WARNED_DEVICE: AtomicBool = AtomicBool::new(false);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn start(device: c_int) -> Option<Global> {
    let path = env("ALLOCTRACE_OUTPUT").unwrap_or_else(|| "alloctrace.atrace".into());
    let mut opts = RecorderOptions::new(path);
    opts.alloc_conf =
        checked_conf(env("ALLOCTRACE_CONF").or_else(|| env("PYTORCH_CUDA_ALLOC_CONF")).unwrap_or_default());
    if let Some(c) = env("ALLOCTRACE_CAPACITY") {
        match crate::engine::config::parse_bytes(&c) {
            Ok(0) => eprintln!(
                "alloctrace: ignoring ALLOCTRACE_CAPACITY=0 (a 0-byte limit fits nothing; unset it for no limit)"
            ),
            Ok(b) => opts.capacity_bytes = Some(b),
            Err(e) => eprintln!("alloctrace: ignoring ALLOCTRACE_CAPACITY: {e}"),
        }
    }
    let stacks = env("ALLOCTRACE_STACKS").is_some_and(|v| v != "0");
    opts.command_line = std::env::args().collect();
    opts.use_tsc = env("ALLOCTRACE_CLOCK").as_deref() != Some("monotonic");
    opts.notes.push(format!("recorded through the C ABI (CUDAPluggableAllocator), device {device}"));
    let dev = if env("ALLOCTRACE_DEVICE").as_deref() == Some("sim") {
        opts.notes.push("simulated device (ALLOCTRACE_DEVICE=sim)".into());
        AnyDevice::Sim(SimDevice::new(opts.capacity_bytes))
    } else {
        match open_cuda(device, &mut opts) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("alloctrace: cannot record: {e}");
                return None;
            }
        }
    };
    match Recorder::start(opts, dev) {
        Ok(rec) => {
            // Close the trace at exit even when the program never calls alloctrace_shutdown.
            // SAFETY: registers a function with no captured state; atexit is thread-safe.
            unsafe { atexit(shutdown_at_exit) };
            Some(Global { rec, device, stacks, pid: std::process::id() })
        }
        Err(e) => {
            eprintln!("alloctrace: cannot record: {e}");
            None
        }
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

extern "C" fn shutdown_at_exit() {
    let _ = alloctrace_shutdown();
}

/// Allocator settings from the environment that the engine can run: a string it cannot parse is
/// replaced by the defaults (a recorder that refuses to start would fail every allocation, and
/// PyTorch would report that as out of memory), and a key that is no allocator setting is
/// pointed out. Both are said on stderr.
fn checked_conf(conf: String) -> String {
    match crate::engine::config::AllocatorConfig::parse(&conf) {
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
fn global(device: c_int) -> Option<&'static Global> {
    GLOBAL.get_or_init(|| start(device)).as_ref()
}

/// PyTorch's `set_init_fn`, called with the number of devices. The recorder starts at the
/// first allocation instead, for the device that allocation names.
#[no_mangle]
pub extern "C" fn alloctrace_init(_device_count: c_int) {}

/// `CUDAPluggableAllocator` malloc: a block of `size` bytes on `stream`; null when out of memory.
#[no_mangle]
pub extern "C" fn alloctrace_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        let g = global(device)?;
        if device != g.device {
            if !WARNED_DEVICE.swap(true, Ordering::Relaxed) {
                eprintln!("alloctrace: allocation on device {device} refused: recording device {} only", g.device);
            }
            return None;
        }
        if size == 0 {
            return None;
        }
        let site = if g.stacks { pystack::current(&g.rec) } else { CallSite::NONE };
        g.rec.malloc_at(size as u64, stream as u64, site).ok().map(|a| a.addr as *mut c_void)
    }))
    .ok()
    .flatten()
    .unwrap_or(std::ptr::null_mut())
}

/// `CUDAPluggableAllocator` free.
#[no_mangle]
pub extern "C" fn alloctrace_free(ptr: *mut c_void, _size: usize, _device: c_int, _stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(Some(g)) = GLOBAL.get() {
            let _ = g.rec.free(ptr as u64);
        }
    }));
}

/// `torch.cuda.empty_cache()` (PyTorch's `set_reset_fn`).
#[no_mangle]
pub extern "C" fn alloctrace_empty_cache() {
    let _ = catch_unwind(|| {
        if let Some(Some(g)) = GLOBAL.get() {
            g.rec.empty_cache();
        }
    });
}

fn mark(kind: MarkKind, label: *const c_char) {
    if label.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(label) }.to_string_lossy();
        if let Some(Some(g)) = GLOBAL.get() {
            g.rec.mark(kind, &text);
        }
    }));
}

/// Labels a phase of the program.
#[no_mangle]
pub extern "C" fn alloctrace_mark(label: *const c_char) {
    mark(MarkKind::Phase, label);
}

/// Labels the start of an iteration.
#[no_mangle]
pub extern "C" fn alloctrace_mark_iteration(label: *const c_char) {
    mark(MarkKind::Iteration, label);
}

/// Events dropped so far (0 before the recorder started).
#[no_mangle]
pub extern "C" fn alloctrace_dropped() -> u64 {
    catch_unwind(|| GLOBAL.get().and_then(|g| g.as_ref()).map_or(0, |g| g.rec.dropped_events())).unwrap_or(0)
}

/// Writes the last events and the trailer. Returns 0 when every event reached the trace,
/// 1 when some were dropped or writing failed, 2 when no recorder ran. Idempotent: later
/// calls return the first result. Allocations keep working afterwards (unrecorded).
#[no_mangle]
pub extern "C" fn alloctrace_shutdown() -> c_int {
    catch_unwind(|| {
        let Some(Some(g)) = GLOBAL.get() else {
            return 2;
        };
        if g.pid != std::process::id() {
            return 2; // a forked child: the trace is the parent's to close
        }
        let mut slot = SUMMARY.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let s = g.rec.finish();
            if let Some(path) = env("ALLOCTRACE_STATUS") {
                let _ = std::fs::write(path, status_text(&s, &g.rec));
            }
            *slot = Some(s);
        }
        let s = slot.as_ref().map(|s| s.writer.clone()).unwrap_or_default();
        if s.events_dropped > 0 || s.error.is_some() || !s.complete {
            1
        } else {
            0
        }
    })
    .unwrap_or(1)
}

fn status_text(s: &RecordSummary, rec: &Recorder<AnyDevice>) -> String {
    #[allow(unused_mut)]
    let mut device_errors = String::new();
    #[cfg(feature = "cuda")]
    rec.with_device(|d| {
        if let AnyDevice::Cuda(c) = d {
            let (msgs, n) = c.errors();
            if n > 0 {
                device_errors = format!("{n} ({})", msgs.join("; "));
            }
        }
    });
    #[cfg(not(feature = "cuda"))]
    let _ = rec;
    let w = &s.writer;
    format!(
        "path={}\nevents={}\nevents_written={}\nevents_dropped={}\ntrace_bytes={}\ncomplete={}\nerror={}\nfree_errors={}\ndevice_errors={}\nwaited_ns={}\n",
        s.path.display(),
        s.events,
        w.events_written,
        w.events_dropped,
        w.trace_bytes,
        w.complete,
        w.error.as_deref().unwrap_or(""),
        s.free_errors,
        device_errors,
        s.waited_ns
    )
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
