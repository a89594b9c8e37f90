//! The engine follows the PyTorch release it is told to: the same request stream, replayed as
//! 2.11 and as 2.12, ends differently where PyTorch's source says the releases differ.

use recorder::device::SimDevice;
use recorder::engine::config::{AllocatorConfig, MIB};
use recorder::engine::version::TorchVersion;
use recorder::engine::Engine;
use recorder::trace::{Event, ReleaseCause};

const V2_11: TorchVersion = TorchVersion::new(2, 11);
const V2_12: TorchVersion = TorchVersion::new(2, 12);

fn engine(conf: &str, cap: u64, version: TorchVersion) -> Engine<SimDevice, Vec<Event>> {
    let config = AllocatorConfig::parse(conf).unwrap();
    Engine::new(config, Some(cap), SimDevice::new(None), Vec::new()).with_torch_version(version)
}

/// The stream: a 60 MiB tensor is freed (its segment stays cached), then an 80 MiB one is
/// asked for under a 100 MiB fraction cap. The cached segment is too small to serve it, and
/// 60 + 80 MiB passes the cap.
fn job(e: &mut Engine<SimDevice, Vec<Event>>) -> Result<(), recorder::engine::OutOfMemory> {
    let a = e.malloc(60 * MIB, 0, 0)?;
    e.free(a.addr).unwrap();
    e.malloc(80 * MIB, 0, 0).map(|_| ())
}

/// PyTorch 2.11 (`malloc`): `alloc_block` fails against the fraction, `release_cached_blocks`
/// frees the cached 60 MiB segment, and the retry gets 80 MiB. PyTorch 2.12 with
/// `throw_on_cudamalloc_oom:True` (PRs #177356, #179057, #179473): "before any driver
/// allocation, if total_allocated_memory + size exceeds the fraction, reject immediately with
/// OutOfMemoryError (skip retry chain)". Same job, same settings: 2.11 completes, 2.12 throws.
#[test]
fn the_same_job_completes_under_2_11_and_throws_at_once_under_2_12() {
    let conf = "throw_on_cudamalloc_oom:True";
    let cap = 100 * MIB;

    let mut old = engine(conf, cap, V2_11);
    job(&mut old).expect("2.11 releases the cache and retries");
    assert_eq!(old.stats().num_alloc_retries, 1);
    assert_eq!(old.stats().num_oom_rejections, 0);
    assert!(old.sink_mut().iter().any(
        |ev| matches!(ev, Event::CacheRelease { cause: ReleaseCause::OomRetry, bytes, .. } if *bytes == 60 * MIB)
    ));
    assert_eq!(old.stats().reserved_bytes.all.current, 80 * MIB);

    let mut new = engine(conf, cap, V2_12);
    let err = job(&mut new).expect_err("2.12 throws before releasing anything");
    assert_eq!((err.alloc_bytes, err.reserved_bytes, err.capacity_bytes), (80 * MIB, 60 * MIB, Some(cap)));
    assert_eq!(new.stats().num_oom_rejections, 1);
    assert_eq!(new.stats().num_ooms, 1);
    assert_eq!(new.stats().num_alloc_retries, 0, "no retry");
    assert!(!new.sink_mut().iter().any(|ev| matches!(ev, Event::CacheRelease { .. })), "no cached block is released");
    assert_eq!(new.stats().reserved_bytes.all.current, 60 * MIB, "the cached segment is still there");
    assert_eq!(new.torch_version(), V2_12);
}

/// Without the key, 2.12 keeps the release-and-retry path: the preemptive check is opt-in.
#[test]
fn without_throw_on_cudamalloc_oom_2_12_retries_as_2_11_does() {
    for version in [V2_11, V2_12, TorchVersion::new(2, 13)] {
        let mut e = engine("", 100 * MIB, version);
        job(&mut e).unwrap_or_else(|err| panic!("{version}: {err}"));
        assert_eq!(e.stats().num_alloc_retries, 1, "{version}");
    }
}

/// The check needs a fraction: with no capacity nothing is rejected, and below the cap the
/// allocation goes ahead on every release.
#[test]
fn the_check_needs_a_fraction_and_fires_only_past_it() {
    let config = AllocatorConfig::parse("throw_on_cudamalloc_oom:True").unwrap();
    let mut unlimited = Engine::new(config, None, SimDevice::new(None), Vec::new()).with_torch_version(V2_12);
    job(&mut unlimited).unwrap();
    assert_eq!(unlimited.stats().num_oom_rejections, 0);
    let mut roomy = engine("throw_on_cudamalloc_oom:True", 140 * MIB, V2_12);
    job(&mut roomy).unwrap();
    assert_eq!((roomy.stats().num_oom_rejections, roomy.stats().num_alloc_retries), (0, 0));
}

/// `max_split_size_mb` adds a step before the full release (`release_available_cached_blocks`):
/// 2.12's rejection skips that one too.
#[test]
fn the_rejection_skips_the_oversize_release_as_well() {
    let conf = "max_split_size_mb:40,throw_on_cudamalloc_oom:True";
    let mut old = engine(conf, 100 * MIB, V2_11);
    job(&mut old).unwrap();
    assert!(old.sink_mut().iter().any(|ev| matches!(ev, Event::CacheRelease { cause: ReleaseCause::Oversize, .. })));
    let mut new = engine(conf, 100 * MIB, V2_12);
    job(&mut new).unwrap_err();
    assert!(!new.sink_mut().iter().any(|ev| matches!(ev, Event::CacheRelease { .. })));
}

/// 2.13's `expandable_segments_reserve`: each new expandable segment reserves that much address
/// space instead of `total + total / 8`. A stream whose pages outgrow it starts a second
/// segment, and free blocks of two segments never merge: a request that the freed pages of one
/// long segment would serve needs new pages. (Each request here stays below the reserve.) Releases before 2.13 refuse the key; the engine
/// reserves the full range for them.
#[test]
fn a_2_13_expandable_reserve_splits_a_stream_into_segments_that_do_not_merge() {
    let total = 1u64 << 30;
    let conf = AllocatorConfig::parse("expandable_segments:True,expandable_segments_reserve:0.25").unwrap();
    let run = |version: TorchVersion| {
        let mut e = Engine::new(conf.clone(), None, SimDevice::new(Some(total)), Vec::<Event>::new())
            .with_torch_version(version);
        // 256 MiB of address space, whole 20 MiB pages: 260 MiB per segment under 2.13.
        let a = e.malloc(200 * MIB, 0, 0).unwrap();
        let b = e.malloc(100 * MIB, 0, 0).unwrap();
        e.free(a.addr).unwrap();
        e.free(b.addr).unwrap();
        e.malloc(250 * MIB, 0, 0).unwrap();
        let contiguous = b.addr == a.addr + 200 * MIB;
        (contiguous, e.stats().reserved_bytes.all.peak)
    };
    let (contiguous, peak) = run(TorchVersion::new(2, 12));
    assert!(contiguous, "one segment: the second request maps the pages right after the first");
    assert_eq!(peak, 300 * MIB, "the two freed ranges merge and serve 250 MiB");
    let (contiguous, peak) = run(TorchVersion::new(2, 13));
    assert!(!contiguous, "the first segment's 260 MiB cannot hold another 100 MiB");
    // The first segment's 200 free MiB take 60 more MiB of pages (whole 20 MiB pages).
    assert_eq!(peak, 360 * MIB, "the freed 200 and 100 MiB do not merge: new pages are mapped");
}
