//! Replays follow the PyTorch release a trace names (or the one asked for), and say which.

use analyzer::model::Trace;
use analyzer::replay::{replay, ReplayOptions};
use recorder::device::SimDevice;
use recorder::engine::config::{AllocatorConfig, MIB};
use recorder::engine::version::TorchVersion;
use recorder::engine::Engine;
use recorder::trace::{Event, Header, Record, Source};
use std::path::Path;

/// The request stream of one job, as the recorder writes it: a 60 MiB tensor freed (its
/// segment stays cached), then an 80 MiB one, under `conf` and a 100 MiB cap, the header
/// naming `torch_version`.
fn job(conf: &str, torch_version: &str) -> Trace {
    let config = AllocatorConfig::parse(conf).unwrap();
    let mut e = Engine::new(config.clone(), Some(100 * MIB), SimDevice::new(None), Vec::<Event>::new());
    let a = e.malloc(60 * MIB, 0, 0).unwrap();
    e.free(a.addr).unwrap();
    e.malloc(80 * MIB, 0, 0).unwrap();
    let (_, events) = e.into_parts();
    let records = events.into_iter().enumerate().map(|(i, event)| Record { time_ns: i as u64 * 1000, event }).collect();
    let mut h = Header::new(Source::Recorded);
    h.alloc_conf = conf.into();
    h.config = config;
    h.capacity_bytes = 100 * MIB;
    h.device_total_bytes = 80 << 30;
    h.torch_version = torch_version.into();
    Trace::from_records(Path::new("job.atrace"), h, records)
}

/// The same request stream: a 2.11 run releases the cached segment and retries; a 2.12 run
/// with `throw_on_cudamalloc_oom:True` throws at the 80 MiB request.
#[test]
fn a_2_12_trace_replays_with_2_12_semantics_and_a_2_11_one_with_2_11() {
    let conf = "throw_on_cudamalloc_oom:True";
    let old = replay(&job(conf, "2.11.0+cu130"), &ReplayOptions::default()).unwrap();
    assert!(!old.is_oom());
    assert_eq!((old.torch_version.as_str(), old.torch_version_assumed, old.num_alloc_retries), ("2.11", false, 1));

    let new = replay(&job(conf, "2.12.0+cu130"), &ReplayOptions::default()).unwrap();
    assert!(new.is_oom(), "2.12 throws at once");
    assert_eq!((new.torch_version.as_str(), new.num_alloc_retries, new.num_oom_rejections), ("2.12", 0, 1));
    assert_eq!(new.capacity_bytes, Some(100 * MIB));

    // The what-if "under 2.12" of the 2.11 trace: the header's release is what a replay follows.
    let mut asked = job(conf, "2.11.0");
    asked.header.torch_version = TorchVersion::new(2, 12).to_string();
    assert!(replay(&asked, &ReplayOptions::default()).unwrap().is_oom());
}

#[test]
fn a_trace_that_names_no_release_is_replayed_as_2_11_and_says_so() {
    let r = replay(&job("", ""), &ReplayOptions::default()).unwrap();
    assert_eq!((r.torch_version.as_str(), r.torch_version_assumed), ("2.11", true));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["torch_version"], "2.11");
    assert_eq!(json["torch_version_assumed"], true);
}

/// `per_process_memory_fraction` in the settings is a cap of fraction x the device's total,
/// truncated before 2.13 and rounded from it (PR #179444).
#[test]
fn a_memory_fraction_setting_becomes_the_capacity_as_the_release_computes_it() {
    // An H100's totalGlobalMem, and a user's 4 GiB cap written as a fraction of it.
    let total = 85_045_510_144u64;
    let wanted = 4u64 << 30;
    let f = wanted as f64 / total as f64;
    let conf = AllocatorConfig::parse(&format!("per_process_memory_fraction:{f}")).unwrap();
    let opts = ReplayOptions { config: Some(conf), ..Default::default() };
    let mut t = job("", "2.12");
    t.header.capacity_bytes = 0;
    t.header.device_total_bytes = total;
    let r = replay(&t, &opts).unwrap();
    assert_eq!(r.capacity_bytes, Some(wanted - 1), "2.12 truncates a product just below 4 GiB");
    t.header.torch_version = "2.13".into();
    let r = replay(&t, &opts).unwrap();
    assert_eq!(r.capacity_bytes, Some(wanted));
    // Without the device's total there is nothing to take a share of.
    t.header.device_total_bytes = 0;
    let e = replay(&t, &opts).unwrap_err().to_string();
    assert!(e.contains("per_process_memory_fraction") && e.contains("--capacity"), "{e}");
}

#[test]
fn a_setting_the_release_does_not_have_is_refused() {
    let t = job("throw_on_cudamalloc_oom:True", "2.11");
    let e = analyzer::source::input::check_keys_for_release(&t).unwrap_err().to_string();
    assert!(e.contains("PyTorch 2.12 and later") && e.contains("--torch-version"), "{e}");
    assert!(analyzer::source::input::check_keys_for_release(&job("throw_on_cudamalloc_oom:True", "2.12")).is_ok());
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/")).join(name)
}

/// `seed_experiments.v213.pickle` is the seed_experiments snapshot with what PyTorch 2.13 adds:
/// `compile_context` and `user_metadata` on every trace entry, `trace_alloc_overflowed` (false)
/// and `trace_alloc_max_entries` in `allocator_settings`. The entries' new keys change nothing;
/// the ring-buffer keys say the snapshot is from 2.13 or later, and that nothing was lost.
#[test]
fn a_2_13_snapshot_imports_as_before_and_names_its_release() {
    use analyzer::source::import::torch::{import_file, ImportOptions};
    let plain = import_file(&fixture("torch/seed_experiments.default.pickle"), &ImportOptions::default()).unwrap();
    let new = import_file(&fixture("seed_experiments.v213.pickle"), &ImportOptions::default()).unwrap();
    assert_eq!(new.records, plain.records);
    assert!(!new.report.ring_buffer_overflowed);
    assert_eq!((plain.header.torch_version.as_str(), new.header.torch_version.as_str()), ("", "2.13"));
    assert!(new.header.notes.iter().any(|n| n.contains("PyTorch 2.13 or later") && n.contains("trace_alloc_")));
    // --torch-version names the exact release.
    let given = ImportOptions { torch_version: Some(TorchVersion::new(2, 14)), ..Default::default() };
    assert_eq!(import_file(&fixture("seed_experiments.v213.pickle"), &given).unwrap().header.torch_version, "2.14");
}

/// A full ring buffer: the import says the oldest entries are lost and what that changes.
#[test]
fn an_overflowed_snapshot_says_its_early_events_are_missing_and_what_that_changes() {
    use analyzer::source::import::torch::{import_file, ImportOptions};
    let im = import_file(&fixture("seed_experiments.max24.pickle"), &ImportOptions::default()).unwrap();
    assert!(im.report.ring_buffer_overflowed);
    assert!(im.header.notes.iter().any(|n| n.contains("oldest entries are lost")));
    assert!(im.header.notes.iter().any(|n| n.contains("what the lost entries change") && n.contains("kept window")));
}

/// Every analysis opened with `--conf per_process_memory_fraction:F` runs under the cap that
/// fraction makes of the device's total memory, as the trace's release computes it.
#[test]
fn a_memory_fraction_in_the_run_facts_is_the_limit_of_every_analysis() {
    use analyzer::source::input::{open, RunFacts};
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../traces/gpt2_train.default.atrace"));
    let conf = AllocatorConfig::parse("per_process_memory_fraction:0.05").unwrap();
    let facts =
        RunFacts { conf: Some(conf.clone()), torch_version: Some(TorchVersion::new(2, 13)), ..Default::default() };
    let t = open(path, &facts).unwrap();
    assert!(t.header.device_total_bytes > 0);
    let cap = (0.05 * t.header.device_total_bytes as f64).round() as u64;
    assert_eq!(t.default_capacity().bytes, Some(cap));
    assert_eq!(t.header.torch_version, "2.13");
    // A limit given in bytes wins.
    let given = RunFacts { capacity_bytes: Some(6 << 30), conf: Some(conf), ..Default::default() };
    assert_eq!(open(path, &given).unwrap().default_capacity().bytes, Some(6 << 30));
}
