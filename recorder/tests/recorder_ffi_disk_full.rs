//! Loss accounting on a full disk: a child process records under a file-size limit
//! (`RLIMIT_FSIZE`, writes past it fail as on a full disk), and the status file and
//! `alloctrace_dropped()` must say exactly what the trace on disk holds.

use recorder::ffi::*;
use recorder::trace::TraceReader;
use std::process::Command;
use std::ptr::null_mut;

const CHILD: &str = "ALLOCTRACE_TEST_DISK_CHILD";

#[repr(C)]
struct Rlimit {
    cur: u64,
    max: u64,
}

extern "C" {
    fn setrlimit(resource: i32, rlim: *const Rlimit) -> i32;
    fn signal(sig: i32, handler: usize) -> usize;
}

const RLIMIT_FSIZE: i32 = 1;
const SIGXFSZ: i32 = 25;
const SIG_IGN: usize = 1;

/// The child: limit file sizes to 96 KiB, record a few hundred thousand events with sizes that
/// compress badly, close the trace, and print what `alloctrace_dropped()` says.
#[test]
fn child_records_onto_a_full_disk() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // SAFETY: plain libc calls on this process.
    unsafe {
        signal(SIGXFSZ, SIG_IGN);
        assert_eq!(setrlimit(RLIMIT_FSIZE, &Rlimit { cur: 96 << 10, max: 96 << 10 }), 0);
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..300_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = alloctrace_malloc(512 + (x % (1 << 20)) as usize, 0, null_mut());
        assert!(!p.is_null());
        alloctrace_free(p, 0, 0, null_mut());
        if i % 50_000 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(150)); // let the writer flush
        }
    }
    let before = alloctrace_dropped();
    assert_eq!(alloctrace_shutdown(), 1, "losses are reported");
    println!("dropped_before_shutdown={before}");
    println!("dropped={}", alloctrace_dropped());
    std::process::exit(0);
}

fn field(text: &str, key: &str) -> u64 {
    // A line may start with the test harness's own words: take the `key=` anywhere in it.
    let at = format!("{key}=");
    text.lines()
        .find_map(|l| l.find(&at).filter(|&i| i == 0 || l.as_bytes()[i - 1] == b' ').map(|i| &l[i + at.len()..]))
        .unwrap_or_else(|| panic!("{key} missing in {text}"))
        .parse()
        .unwrap()
}

#[test]
fn a_full_disk_is_accounted_exactly() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("full.atrace");
    let status_dir = dir.join("status");
    std::fs::create_dir(&status_dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_records_onto_a_full_disk", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("ALLOCTRACE_DEVICE", "sim")
        .env("ALLOCTRACE_CLOCK", "monotonic")
        .env("ALLOCTRACE_OUTPUT", &path)
        .env("ALLOCTRACE_STATUS", &status_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let status_file = std::fs::read_dir(&status_dir).unwrap().next().expect("a status file").unwrap().path();
    let status = std::fs::read_to_string(status_file).unwrap();

    let file_bytes = std::fs::metadata(&path).unwrap().len();
    assert!(file_bytes <= 96 << 10);
    let mut events_on_disk = 0u64;
    if let Ok(mut r) = TraceReader::open(&path) {
        while r.next().is_some() {
            events_on_disk += 1;
        }
    }
    let (events, written, dropped) =
        (field(&status, "events"), field(&status, "events_written"), field(&status, "events_dropped"));
    assert!(events >= 600_000, "{status}");
    assert!(events_on_disk > 0, "the trace holds what fitted: {status}");
    assert_eq!(written, events_on_disk, "events_written is what the file holds: {status}");
    assert_eq!(written + dropped, events, "every event is written or dropped: {status}");
    assert_eq!(field(&status, "trace_bytes"), file_bytes, "{status}");
    assert!(status.contains("complete=false"), "{status}");
    assert_eq!(field(&stdout, "dropped"), dropped, "alloctrace_dropped() agrees with the status: {stdout}");
    assert!(field(&stdout, "dropped_before_shutdown") > 0, "losses show before shutdown: {stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
