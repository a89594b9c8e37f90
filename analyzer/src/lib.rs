//! alloctrace's analyzer: reads traces (and foreign formats), replays them through the
//! recorder's engine on a simulated device, computes and renders.

pub mod advice;
pub mod capacity_search;
pub mod category;
pub mod cmd;
pub mod diff;
pub mod escape;
pub mod explain;
pub mod export;
pub mod frag;
pub mod ids;
pub mod import;
pub mod input;
pub mod leaks;
pub mod model;
pub mod outcome;
pub mod output;
pub mod patterns;
pub mod plot;
pub mod progress;
pub mod ranks;
pub mod raster;
pub mod replay;
pub mod report;
pub mod streams;
pub mod summary;
pub mod synth;
pub mod timeline;
pub mod tracefile;
pub mod units;
pub mod whatif;
pub mod wrap;

/// The traces shipped in `traces/` (not `traces/large/`), for tests that check a property on
/// every one of them.
#[cfg(test)]
pub(crate) fn shipped_traces() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "atrace"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 10, "{paths:?}");
    paths
}
