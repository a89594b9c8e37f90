//! Opening what a user hands an analysis: an `.atrace` file, or a PyTorch memory snapshot
//! (`.pickle`), imported on the fly in memory. Snapshots store neither the memory limit the
//! program ran under nor its `PYTORCH_CUDA_ALLOC_CONF`: `--capacity` and `--conf` give them.

use crate::model::Trace;
use crate::source::import::torch::{import_file, ImportOptions, Imported};
use anyhow::Result;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::version::TorchVersion;
use std::io::Read;
use std::path::Path;

/// What the user says about the run, beyond the file.
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    /// The limit the run ran under (a memory fraction): overrides the trace's.
    pub capacity_bytes: Option<u64>,
    /// The allocator settings the run used: override the trace's.
    pub conf: Option<AllocatorConfig>,
    /// For a snapshot: which device's history to analyse.
    pub device: usize,
    /// The PyTorch release the run used: overrides the trace's; its allocator is followed.
    pub torch_version: Option<TorchVersion>,
    /// Where the limit is inferred as a range: the least limit at which the recorded run replays
    /// as recorded ([`crate::model::Trace::least_limit`]), found by replays of an earlier open
    /// (`cmd::open_input` does both).
    pub least_limit: Option<u64>,
}

/// Whether `path` holds a pickle (protocol 2 or later starts with 0x80) rather than a trace.
pub fn is_pickle(path: &Path) -> bool {
    let mut b = [0u8; 1];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut b)).is_ok() && b[0] == 0x80
}

/// `--device` picks a snapshot's device: a trace holds one, device 0.
pub fn trace_has_one_device(path: &Path, device: usize) -> Result<()> {
    anyhow::ensure!(
        device == 0,
        "{}: --device picks a device of a PyTorch snapshot; an .atrace file holds one device",
        path.display()
    );
    Ok(())
}

/// Imports the snapshot at `path` as the analyses read it: where no capacity is given and the
/// trace implies one (an OOM with room left on the device, or a full device), its cache releases
/// are told apart against that limit, the one every replay of it then assumes
/// ([`ImportOptions::releases_limit`]): imported once to find it, and again with it.
/// `least_limit`: where the limit is inferred as a range, the least at which the recorded run
/// replays as recorded ([`RunFacts::least_limit`]), which raises the limit assumed.
pub fn import_as_analysed(path: &Path, opts: &ImportOptions, least_limit: Option<u64>) -> Result<Imported> {
    let imported = import_file(path, opts)?;
    if opts.capacity_bytes.is_some() || imported.header.capacity_bytes > 0 {
        return Ok(imported);
    }
    let implied = Trace::default_capacity_of(&imported.header, &imported.records).raised_to(least_limit);
    match implied.bytes {
        Some(limit) if implied.source != crate::model::CapacitySource::None => {
            Ok(import_file(path, &ImportOptions { releases_limit: Some(limit), ..opts.clone() })?)
        }
        _ => Ok(imported),
    }
}

/// Opens `path` (a trace, or a snapshot imported in memory) with the user's facts applied.
pub fn open(path: &Path, facts: &RunFacts) -> Result<Trace> {
    open_with_budget(path, facts, None)
}

/// [`open`], a trace's records kept in memory up to `budget_bytes` where given (see
/// [`Trace::open_with_budget`]; a snapshot is imported whole).
pub fn open_with_budget(path: &Path, facts: &RunFacts, budget_bytes: Option<usize>) -> Result<Trace> {
    let mut trace = if is_pickle(path) {
        let imported = import_as_analysed(
            path,
            &ImportOptions {
                device: facts.device,
                capacity_bytes: facts.capacity_bytes,
                torch_version: facts.torch_version,
                ..Default::default()
            },
            facts.least_limit,
        )?;
        // Named by file: a command reading several (diff, ranks) says which one.
        for w in &imported.report.warnings {
            crate::model::escape::warn(format!("{}: {w}", path.display()));
        }
        Trace::from_records(path, imported.header, imported.records)
    } else {
        trace_has_one_device(path, facts.device)?;
        match budget_bytes {
            Some(b) => Trace::open_with_budget(path, b)?,
            None => Trace::open(path)?,
        }
    };
    // A given limit is kept beside the header, which stays as recorded (see `Trace::capacity`).
    if let Some(c) = facts.capacity_bytes {
        trace.given_capacity = Some(c);
    }
    trace.least_limit = facts.least_limit;
    if let Some(conf) = &facts.conf {
        trace.header.alloc_conf = conf.to_string();
        trace.header.config = conf.clone();
    }
    if let Some(v) = facts.torch_version {
        trace.header.torch_version = v.to_string();
    }
    check_keys_for_release(&trace)?;
    // `per_process_memory_fraction` in the user's settings: the limit, as the release computes
    // it from the device's total, unless one was given.
    if let (None, Some(f)) = (facts.capacity_bytes, facts.conf.as_ref().and_then(|c| c.memory_fraction())) {
        anyhow::ensure!(
            trace.header.device_total_bytes > 0,
            "{}: per_process_memory_fraction:{f} is a share of the device's memory, which the trace does not \
             record; give the limit in bytes with --capacity",
            path.display()
        );
        let version = TorchVersion::from_header(&trace.header.torch_version).unwrap_or_default();
        if let Some(c) = version.fraction_cap(f, trace.header.device_total_bytes) {
            trace.given_capacity = Some(c);
        }
    }
    Ok(trace)
}

/// Refuses settings the trace's PyTorch release does not have (PyTorch itself refuses them:
/// "Unrecognized key"), e.g. `throw_on_cudamalloc_oom` asked of 2.11.
pub fn check_keys_for_release(trace: &Trace) -> Result<()> {
    let version = TorchVersion::from_header(&trace.header.torch_version).unwrap_or_default();
    for (key, _) in &trace.header.config.other {
        version.check_key(key).map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (the run is replayed as PyTorch {version}; --torch-version names another)",
                trace.path.display()
            )
        })?;
    }
    Ok(())
}

/// Why an analysis of `trace` has nothing to work on, if it has not: no allocation request at
/// all, or a snapshot taken without allocation history (only its final segments and blocks).
pub fn nothing_to_analyse(trace: &Trace) -> Option<String> {
    let no_history = trace.header.notes.iter().any(|n| n.contains("without a trace"));
    (trace.facts.last_alloc.is_none() || no_history).then(|| {
        format!(
            "{}: nothing to analyse: the trace holds no allocation request{}",
            trace.path.display(),
            if no_history { format!(" ({})", crate::source::import::torch::NO_HISTORY) } else { String::new() }
        )
    })
}
