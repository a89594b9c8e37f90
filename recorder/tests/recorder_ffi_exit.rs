//! The C ABI in a process of its own (this test binary, re-run as the child): settings the
//! engine cannot parse fall back to the defaults instead of failing every allocation, and a
//! program that exits without calling `alloctrace_shutdown` still leaves a complete trace.

use recorder::ffi::*;
use recorder::trace::{Event, TraceEnd, TraceReader};
use std::ffi::CString;
use std::process::Command;
use std::ptr::null_mut;

const CHILD: &str = "ALLOCTRACE_TEST_CHILD";

/// The child's part: allocate, mark, and exit without shutting the recorder down.
#[test]
fn child_allocates_and_exits_without_shutdown() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful as the child of the test below
    }
    let p = alloctrace_malloc(4096, 0, null_mut());
    assert!(!p.is_null(), "a bad setting must not fail the allocation");
    let label = CString::new("before-exit").unwrap();
    alloctrace_mark(label.as_ptr());
    alloctrace_free(p, 4096, 0, null_mut());
    std::process::exit(0);
}

#[test]
fn bad_settings_fall_back_and_exit_closes_the_trace() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("exit.atrace");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_allocates_and_exits_without_shutdown", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("ALLOCTRACE_DEVICE", "sim")
        .env("ALLOCTRACE_OUTPUT", &path)
        .env("ALLOCTRACE_CONF", "max_split_size_mb:abc")
        .env("ALLOCTRACE_CAPACITY", "0")
        .env_remove("ALLOCTRACE_STATUS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("recording with the default settings"), "{stderr}");
    assert!(stderr.contains("ignoring ALLOCTRACE_CAPACITY=0"), "{stderr}");

    let mut r = TraceReader::open(&path).unwrap();
    assert_eq!(r.header().alloc_conf, "");
    assert_eq!(r.header().capacity_bytes, 0);
    let recs = r.read_all();
    assert!(matches!(r.end(), TraceEnd::Complete { .. }), "closed at exit: {:?}", r.end());
    assert_eq!(recs.iter().filter(|r| matches!(r.event, Event::Alloc { .. })).count(), 1);
    assert!(recs.iter().any(|r| matches!(&r.event, Event::Mark { text, .. } if text == "before-exit")));
    let _ = std::fs::remove_dir_all(&dir);
}
