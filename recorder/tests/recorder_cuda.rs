//! The CUDA device on a real GPU. Ignored by default (CI has no GPU): run with
//! `cargo test -p alloctrace-recorder --features cuda --test recorder_cuda -- --ignored`.
#![cfg(feature = "cuda")]

use recorder::device::cuda::{driver_present, CudaDevice};
use recorder::device::Device;
use recorder::recorder::{replay, Recorder, RecorderOptions};
use recorder::trace::{Event, TraceReader};

const MIB: u64 = 1 << 20;

#[test]
fn without_a_driver_the_error_is_clear() {
    if driver_present() {
        return;
    }
    let e = CudaDevice::new(0).err().expect("no driver, no device");
    assert!(e.to_string().contains("no CUDA driver"), "{e}");
}

#[test]
#[ignore = "needs a GPU"]
fn segments_and_vmm_pages() {
    let mut d = CudaDevice::new(0).expect("device 0");
    let (free0, total) = d.mem_info().expect("mem_info");
    assert!(free0 > 0 && total >= free0);
    let a = d.alloc_segment(20 * MIB, 0).expect("cuMemAlloc");
    d.free_segment(a, 20 * MIB);
    let g = d.granularity_bytes();
    let va = d.reserve_address_space(64 * g).expect("reserve");
    assert!(d.map(va, 10 * g, 0));
    assert!(d.map(va + 10 * g, 2 * g, 0));
    d.unmap(va + 2 * g, 4 * g);
    d.unmap(va, 2 * g);
    d.release_address_space(va, 64 * g);
    assert_eq!(d.errors().1, 0, "{:?}", d.errors().0);
}

#[test]
#[ignore = "needs a GPU"]
fn recorder_on_cuda_replays_exactly() {
    for conf in ["", "expandable_segments:True"] {
        let path = std::env::temp_dir().join(format!("alloctrace-cuda-{}.atrace", conf.len()));
        let mut opts = RecorderOptions::new(&path);
        opts.alloc_conf = conf.into();
        let rec = Recorder::start(opts, CudaDevice::new(0).expect("device 0")).expect("start");
        let mut live = Vec::new();
        for i in 0..2000u64 {
            live.push(rec.malloc(512 + (i * 7919) % (24 * MIB), 0).expect("malloc").addr);
            if i % 3 == 0 {
                rec.free(live.swap_remove((i as usize * 31) % live.len())).unwrap();
            }
        }
        for a in live {
            rec.free(a).unwrap();
        }
        rec.empty_cache();
        let s = rec.finish();
        assert_eq!(s.writer.events_dropped, 0);
        let mut r = TraceReader::open(&path).unwrap();
        let first = r.next().unwrap();
        assert!(matches!(first.event, Event::DeviceMemInfo { .. }), "{first:?}");
        let c = replay::check_segments(&path).unwrap();
        assert!(c.same(), "[{conf}] first difference at {:?}", c.first_difference());
        assert!(!c.recorded.is_empty());
        assert_eq!(rec.with_device(|d| d.errors().1), 0);
    }
}
