//! The C ABI on the simulated device (`ALLOCTRACE_DEVICE=sim`): PyTorch's entry points, marks,
//! empty_cache and shutdown with its status file. One test: the ABI has one global recorder.

use recorder::engine::config::parse_bytes;
use recorder::ffi::*;
use recorder::trace::{Event, MarkKind, ReleaseCause, TraceEnd, TraceReader};
use std::ffi::CString;
use std::ptr::null_mut;

#[test]
fn the_c_abi_records_a_trace() {
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ffi.atrace");
    let status = dir.join("status");
    std::fs::create_dir_all(&status).unwrap();
    std::env::set_var("ALLOCTRACE_DEVICE", "sim");
    std::env::set_var("ALLOCTRACE_OUTPUT", &path);
    std::env::set_var("ALLOCTRACE_STATUS", &status);
    std::env::set_var("ALLOCTRACE_CONF", "expandable_segments:True");
    std::env::set_var("ALLOCTRACE_CAPACITY", "1GiB");
    std::env::set_var("ALLOCTRACE_CLOCK", "monotonic");

    alloctrace_init(1);
    let p = alloctrace_malloc(4096, 0, null_mut());
    assert!(!p.is_null());
    assert!(alloctrace_malloc(0, 0, null_mut()).is_null());
    // Another device: a recorder and a trace of its own.
    let other = alloctrace_malloc(4096, 1, null_mut());
    assert!(!other.is_null());
    alloctrace_free(other, 4096, 1, null_mut());
    assert!(alloctrace_malloc(2 << 30, 0, null_mut()).is_null(), "out of memory is null");
    let label = CString::new("forward").unwrap();
    alloctrace_mark(label.as_ptr());
    alloctrace_mark_iteration(label.as_ptr());
    alloctrace_mark(std::ptr::null());
    // record_stream: a block used on stream 7 is freed in two steps; the free completes once
    // the event recorded on stream 7 has (the simulated device's events complete at their
    // second query), and the allocation stream itself is not waited for.
    let used = alloctrace_malloc(1 << 20, 0, null_mut());
    alloctrace_record_stream(used, 7 as *mut _);
    alloctrace_record_stream(used, null_mut());
    alloctrace_free(used, 1 << 20, 0, null_mut());
    let s = alloctrace_malloc(1 << 20, 0, null_mut());
    assert_ne!(s, used, "the block is not reused while stream 7 may still read it");
    let t = alloctrace_malloc(1 << 20, 0, null_mut());
    assert_eq!(t, used, "reused once the event completed");
    alloctrace_free(s, 1 << 20, 0, null_mut());
    alloctrace_free(t, 1 << 20, 0, null_mut());
    alloctrace_free(p, 4096, 0, null_mut());
    alloctrace_free(0xdead as *mut _, 1, 0, null_mut());
    alloctrace_empty_cache();
    assert_eq!(alloctrace_dropped(), 0);
    assert_eq!(alloctrace_shutdown(), 0);
    assert_eq!(alloctrace_shutdown(), 0, "idempotent");
    // Still allocates after shutdown, unrecorded.
    let q = alloctrace_malloc(4096, 0, null_mut());
    assert!(!q.is_null());
    alloctrace_free(q, 4096, 0, null_mut());

    let pid = std::process::id();
    let text = std::fs::read_to_string(status.join(format!("status.{pid}.0"))).unwrap();
    assert!(std::fs::read_to_string(status.join(format!("status.{pid}.1"))).unwrap().contains("device=1"));
    let mut r1 = TraceReader::open(dir.join("ffi.dev1.atrace")).unwrap();
    assert_eq!(r1.header().placement.device_index, Some(1));
    assert_eq!(r1.read_all().iter().filter(|r| matches!(r.event, Event::Alloc { .. })).count(), 1);
    assert!(text.contains("events_dropped=0") && text.contains("complete=true") && text.contains("free_errors=1"));
    let mut r = TraceReader::open(&path).unwrap();
    assert_eq!(r.header().alloc_conf, "expandable_segments:True");
    assert_eq!(r.header().capacity_bytes, 1 << 30);
    assert!(r.header().notes.iter().any(|n| n == "clock: CLOCK_MONOTONIC"), "{:?}", r.header().notes);
    let recs = r.read_all();
    assert!(matches!(r.end(), TraceEnd::Complete { .. }));
    let has = |f: &dyn Fn(&Event) -> bool| recs.iter().any(|r| f(&r.event));
    assert!(has(&|e| matches!(e, Event::Mark { kind: MarkKind::Phase, text } if text == "forward")));
    assert!(has(&|e| matches!(e, Event::Mark { kind: MarkKind::Iteration, .. })));
    assert!(has(&|e| matches!(e, Event::SegmentMap { .. })));
    assert!(has(&|e| matches!(e, Event::SegmentUnmap { .. })));
    assert!(has(&|e| matches!(e, Event::Oom { .. })));
    assert!(has(&|e| matches!(e, Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. })));
    assert_eq!(r.header().placement.device_index, Some(0));
    // The deferred free: requested at the free, completed only after the block was passed over.
    let pos = |f: &dyn Fn(&Event) -> bool| recs.iter().position(|r| f(&r.event)).unwrap();
    let r_addr = used as u64;
    let requested = pos(&|e| matches!(e, Event::FreeRequested { addr, .. } if *addr == r_addr));
    let completed = pos(&|e| matches!(e, Event::FreeCompleted { addr, .. } if *addr == r_addr));
    let s_alloc = pos(&|e| matches!(e, Event::Alloc { addr, .. } if *addr == s as u64));
    assert!(requested < s_alloc && s_alloc < completed, "{requested} {s_alloc} {completed}");
    assert_eq!(parse_bytes("40GiB").ok(), Some(40 << 30));
    assert_eq!(parse_bytes("1.5k").ok(), Some(1536));
    assert_eq!(parse_bytes("12").ok(), Some(12));
    assert_eq!(parse_bytes("x").ok(), None);
    let _ = std::fs::remove_dir_all(&dir);
}
