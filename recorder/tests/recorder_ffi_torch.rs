//! The default back-end's entry point: PyTorch's allocator trace entries, as the helper forwards
//! them, become a trace of their own per rank and device, with the placement in the header, the
//! private pool of a CUDA graph's segments, and the limit the job set itself (its memory
//! fraction, which the shim lifts) as the header's capacity.
//! Run in a child process (the C ABI has one set of recorders per process).

use recorder::ffi::torch_action::*;
use recorder::ffi::*;
use recorder::trace::{Event, Placement, Pool, ReleaseCause, TraceEnd, TraceReader};
use std::process::Command;

const CHILD: &str = "ALLOCTRACE_TEST_TORCH_CHILD";

#[test]
fn child_forwards_torch_entries() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let (seg, small_seg) = (0x7f00_0000_0000u64, 0x7e00_0000_0000u64);
    // The job's own limit, set before its first allocation: the header's capacity.
    assert_eq!(alloctrace_set_capacity(1, 1 << 30), 1);
    assert_eq!(alloctrace_set_capacity(1, 3 << 30), 1, "a later call replaces it");
    assert_eq!(alloctrace_set_capacity(1, 0), -1, "0 bytes is no limit");
    alloctrace_torch_entry(SEGMENT_ALLOC, 1, seg, 20 << 20, 5);
    alloctrace_torch_entry(ALLOC, 1, seg, 4_000_000, 5);
    alloctrace_torch_entry(SEGMENT_ALLOC, 1, small_seg, 2 << 20, 5);
    alloctrace_torch_entry(ALLOC, 1, small_seg, 1000, 5);
    alloctrace_torch_entry(FREE_REQUESTED, 1, seg, 4_000_000, 5);
    alloctrace_torch_entry(FREE_COMPLETED, 1, seg, 4_000_000, 5);
    alloctrace_torch_entry(FREE_REQUESTED, 1, 0xdead, 1, 5); // unknown: skipped
    alloctrace_torch_entry(SEGMENT_FREE, 1, seg, 20 << 20, 5);
    alloctrace_torch_entry(OOM, 1, 123, 1 << 40, 5);
    // A CUDA graph's private pool (PyTorch's pool id (1, 0)), with PyTorch's clock readings.
    let graph_seg = 0x7d00_0000_0000u64;
    alloctrace_torch_event(SEGMENT_ALLOC, 1, graph_seg, 2 << 20, 5, 1_000, 1, 0);
    alloctrace_torch_event(ALLOC, 1, graph_seg, 512, 5, 2_000, 1, 0);
    // A second device of the same process: a trace of its own.
    alloctrace_torch_entry(ALLOC, 2, 0x1000, 512, 0);
    // Set after the device's header was written: reported in its status file instead.
    assert_eq!(alloctrace_set_capacity(2, 1 << 30), 0);
    assert_eq!(alloctrace_shutdown(), 0);
    std::process::exit(0);
}

#[test]
fn torch_entries_make_one_trace_per_rank_and_device() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-ffi-torch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_forwards_torch_entries", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("ALLOCTRACE_DEVICE", "sim")
        .env("ALLOCTRACE_CLOCK", "monotonic")
        .env("ALLOCTRACE_OUTPUT", dir.join("run.atrace"))
        .env("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
        .env("RANK", "3")
        .env("LOCAL_RANK", "1")
        .env("WORLD_SIZE", "4")
        .env_remove("ALLOCTRACE_STATUS")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut r = TraceReader::open(dir.join("run.rank3.atrace")).unwrap();
    assert_eq!(
        r.header().placement,
        Placement { device_index: Some(1), rank: Some(3), local_rank: Some(1), world_size: Some(4) }
    );
    assert_eq!(r.header().alloc_conf, "max_split_size_mb:64", "PyTorch's settings are the job's");
    assert_eq!(r.header().capacity_bytes, 3 << 30, "the limit the job set itself");
    assert!(r.header().notes.iter().any(|n| n.contains("PyTorch's caching allocator ran the job")));
    let events: Vec<Event> =
        r.read_all().into_iter().map(|r| r.event).filter(|e| !matches!(e, Event::DeviceMemInfo { .. })).collect();
    assert!(matches!(r.end(), TraceEnd::Complete { .. }));
    let (seg, small_seg, graph_seg) = (0x7f00_0000_0000u64, 0x7e00_0000_0000u64, 0x7d00_0000_0000u64);
    assert_eq!(
        events,
        vec![
            Event::SegmentAlloc { addr: seg, bytes: 20 << 20, stream: 5, pool: Pool::Large },
            Event::Alloc {
                id: 1,
                addr: seg,
                requested_bytes: 4_000_000,
                block_bytes: 0,
                stream: 5,
                pool: Pool::Large,
                callsite: 0
            },
            Event::SegmentAlloc { addr: small_seg, bytes: 2 << 20, stream: 5, pool: Pool::Small },
            Event::Alloc {
                id: 2,
                addr: small_seg,
                requested_bytes: 1000,
                block_bytes: 0,
                stream: 5,
                pool: Pool::Small,
                callsite: 0
            },
            Event::FreeRequested { id: 1, addr: seg, callsite: 0 },
            Event::FreeCompleted { id: 1, addr: seg },
            Event::SegmentFree { addr: seg, bytes: 20 << 20, stream: 5, pool: Pool::Large },
            // The release before an OOM is PyTorch's last resort.
            Event::CacheRelease { cause: ReleaseCause::OomRetry, bytes: 20 << 20, segments: 1 },
            Event::Oom {
                requested_bytes: 1 << 40,
                alloc_bytes: 1 << 40,
                device_free_bytes: 123,
                reserved_bytes: 2 << 20,
                allocated_bytes: 1024,
                limit_bytes: 0,
                stream: 5
            },
            Event::SegmentAlloc { addr: graph_seg, bytes: 2 << 20, stream: 5, pool: Pool::Small },
            Event::SegmentPool { addr: graph_seg, pool_id: [1, 0] },
            Event::Alloc {
                id: 3,
                addr: graph_seg,
                requested_bytes: 512,
                block_bytes: 0,
                stream: 5,
                pool: Pool::Small,
                callsite: 0
            },
        ]
    );
    let mut r2 = TraceReader::open(dir.join("run.rank3.dev2.atrace")).unwrap();
    assert_eq!(r2.header().placement.device_index, Some(2));
    assert_eq!(r2.header().capacity_bytes, 0, "set after its header was written");
    assert_eq!(r2.read_all().iter().filter(|r| matches!(r.event, Event::Alloc { .. })).count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
