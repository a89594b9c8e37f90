//! The default back-end's call sites: the helper gives each allocation's stack an id under
//! PyTorch's lock, and defines it later, once resolved outside the lock. The trace still defines
//! every call site before its first use, once; the recorder's own frames are left out; a site
//! whose definition never comes is written as none; and a process killed with `kill -9` keeps
//! the call sites of every flushed event.
//! Run in child processes (the C ABI has one set of recorders per process).

use recorder::ffi::torch_action::*;
use recorder::ffi::*;
use recorder::trace::{Event, Frame, TraceEnd, TraceReader, NO_CALLSITE};
use std::ffi::{c_char, CString};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const CHILD: &str = "ALLOCTRACE_TEST_SITES_CHILD";

fn define(id: u32, frames: &[(&str, u32, &str)]) {
    let files: Vec<CString> = frames.iter().map(|f| CString::new(f.0).unwrap()).collect();
    let functions: Vec<CString> = frames.iter().map(|f| CString::new(f.2).unwrap()).collect();
    let file_ptrs: Vec<*const c_char> = files.iter().map(|s| s.as_ptr()).collect();
    let function_ptrs: Vec<*const c_char> = functions.iter().map(|s| s.as_ptr()).collect();
    let lines: Vec<u32> = frames.iter().map(|f| f.1).collect();
    alloctrace_define_callsite(id, frames.len() as u64, file_ptrs.as_ptr(), lines.as_ptr(), function_ptrs.as_ptr());
}

fn alloc(addr: u64, site: u32) {
    alloctrace_torch_event_at(ALLOC, 0, addr, 4096, 0, 0, 0, 0, site);
}

const MLP: &[(&str, u32, &str)] = &[
    ("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 134, "forward"),
    ("model.py", 20, "forward"),
    ("train.py", 57, "main"),
];
const BACKWARD: &[(&str, u32, &str)] =
    &[("/tmp/alloctrace-Xy/alloctrace_hook.py", 135, "backward"), ("train.py", 58, "main")];

#[test]
fn child_sites() {
    let Ok(mode) = std::env::var(CHILD) else { return };
    alloctrace_torch_event(SEGMENT_ALLOC, 0, 0x10_0000, 20 << 20, 0, 0, 0, 0);
    // Site 1 is resolved after its first use, on another thread, as the resolver does.
    let resolver = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(50));
        define(1, MLP);
    });
    alloc(0x10_0000, 1);
    define(2, BACKWARD);
    alloc(0x10_1000, 2);
    alloc(0x10_2000, 1);
    alloc(0x10_3000, NO_CALLSITE);
    resolver.join().unwrap();
    if mode == "kill" {
        // Past the writer's flush (100 ms), then killed: no trailer.
        std::thread::sleep(Duration::from_millis(400));
        let _ = Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        std::thread::sleep(Duration::from_secs(10));
    }
    // Site 3 is never defined: at the end the writer stops waiting for it.
    alloc(0x10_4000, 3);
    assert_eq!(alloctrace_shutdown(), 0);
    std::process::exit(0);
}

fn run_child(dir: &Path, mode: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_sites", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .env("ALLOCTRACE_DEVICE", "sim")
        .env("ALLOCTRACE_OUTPUT", dir.join("run.atrace"))
        .env_remove("ALLOCTRACE_STATUS")
        .env_remove("RANK")
        .output()
        .unwrap()
}

/// The allocations' call sites as the trace names them, in order, checking that each is
/// defined once, before its first use.
fn sites_of_allocs(path: &Path) -> (Vec<Option<Vec<Frame>>>, TraceEnd) {
    let mut r = TraceReader::open(path).unwrap();
    let mut defined = std::collections::HashMap::new();
    let mut out = Vec::new();
    for rec in r.read_all() {
        match rec.event {
            Event::CallSite { id, frames } => {
                assert!(defined.insert(id, frames).is_none(), "call site {id} defined twice");
            }
            Event::Alloc { callsite, .. } => {
                if callsite != NO_CALLSITE {
                    assert!(defined.contains_key(&callsite), "call site {callsite} used before its definition");
                }
                out.push(defined.get(&callsite).cloned());
            }
            _ => {}
        }
    }
    (out, r.end().clone())
}

fn frames(f: &[(&str, u32, &str)]) -> Vec<Frame> {
    f.iter().map(|f| Frame { file: f.0.into(), line: f.1, function: f.2.into() }).collect()
}

#[test]
fn call_sites_resolved_late_are_defined_before_their_first_use() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-sites-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_child(&dir, "end");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (sites, end) = sites_of_allocs(&dir.join("run.atrace"));
    assert!(matches!(end, TraceEnd::Complete { .. }), "{end:?}");
    // The shim's frame is left out of site 2.
    let (mlp, backward) = (Some(frames(MLP)), Some(frames(&BACKWARD[1..])));
    assert_eq!(sites, vec![mlp.clone(), backward, mlp, None, None]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_process_keeps_the_call_sites_it_flushed() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-sites-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_child(&dir, "kill");
    assert!(!out.status.success(), "the child was to be killed");
    let (sites, end) = sites_of_allocs(&dir.join("run.atrace"));
    assert!(matches!(end, TraceEnd::Truncated { .. }), "{end:?}");
    let (mlp, backward) = (Some(frames(MLP)), Some(frames(&BACKWARD[1..])));
    assert_eq!(sites, vec![mlp.clone(), backward, mlp, None]);
    let _ = std::fs::remove_dir_all(&dir);
}
