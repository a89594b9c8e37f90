//! Forks while other threads allocate: a child gets the recorder's memory but not its writer
//! thread. Every child must finish its allocations promptly (it records nothing and never waits
//! for the parent's writer), and the parent's trace stays complete.

use recorder::ffi::*;
use recorder::trace::{TraceEnd, TraceReader};
use std::process::Command;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD: &str = "ALLOCTRACE_TEST_FORK_CHILD";

extern "C" {
    fn fork() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
    fn _exit(code: i32) -> !;
}
const WNOHANG: i32 = 1;

fn churn(n: usize) {
    for i in 0..n {
        let p = alloctrace_malloc(512 + (i % 97) * 4096, 0, null_mut());
        assert!(!p.is_null());
        alloctrace_free(p, 0, 0, null_mut());
    }
}

/// The process that records and forks (run as a child of the test below, so that its
/// recorder is its own).
#[test]
fn child_forks_while_allocating() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    churn(10);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    churn(1000);
                }
            })
        })
        .collect();
    let (mut hung, mut failed, mut slowest) = (0, 0, Duration::ZERO);
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: the child only allocates through the recorder and exits with `_exit`.
        let pid = unsafe { fork() };
        if pid == 0 {
            // 50,000 pairs: about 25 full batches, each of which would wait for a writer that
            // does not exist in this process if the child recorded.
            let ok = std::panic::catch_unwind(|| churn(50_000)).is_ok();
            let code = if ok && alloctrace_shutdown() == 2 { 0 } else { 1 };
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { _exit(code) };
        }
        assert!(pid > 0, "fork failed");
        let t = Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child.
            let r = unsafe { waitpid(pid, &mut status, WNOHANG) };
            if r == pid {
                if status != 0 {
                    failed += 1;
                }
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                hung += 1;
                // SAFETY: our own child.
                unsafe {
                    kill(pid, 9);
                    waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        slowest = slowest.max(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().unwrap());
    // 0, or 1 when the writer could not keep up with two threads allocating flat out.
    assert_ne!(alloctrace_shutdown(), 2, "the parent closes its trace");
    println!("hung={hung} failed={failed} slowest_ms={}", slowest.as_millis());
    std::process::exit(0);
}

#[test]
fn forked_children_never_wait_for_the_parents_writer() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-fork-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fork.atrace");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_forks_while_allocating", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("ALLOCTRACE_DEVICE", "sim")
        .env("ALLOCTRACE_CLOCK", "monotonic")
        .env("ALLOCTRACE_OUTPUT", &path)
        .env_remove("ALLOCTRACE_STATUS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("hung=0 failed=0"), "{stdout}");
    let ms: u64 = stdout.split("slowest_ms=").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    // 50,000 pairs take a few tens of ms; a child waiting for a writer would take 25 x 20 ms.
    assert!(ms < 400, "a child took {ms} ms");
    let mut r = TraceReader::open(&path).unwrap();
    r.read_all();
    assert!(matches!(r.end(), TraceEnd::Complete { .. }), "{:?}", r.end());
    let _ = std::fs::remove_dir_all(&dir);
}
