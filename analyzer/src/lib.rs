//! alloctrace's analyzer: reads traces (and foreign formats), replays them through the
//! recorder's engine on a simulated device, computes and renders.

pub mod analysis;
pub mod cmd;
pub mod model;
pub mod render;
pub mod replay;
pub mod source;

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
