//! `alloctrace record`'s fallback for the default back-end: where alloctrace's PyTorch helper
//! could not be built (no compiler) or `--stacks` asks for Python call sites, the shim keeps
//! PyTorch's own allocator history and dumps it; this turns each dump into traces with the
//! importer.

use recorder::trace::TraceWriter;
use std::path::{Path, PathBuf};

/// The default back-end's fallback: PyTorch's history, dumped by the shim at exit, at an OOM or
/// on SIGTERM as `snapshot.<pid>.pickle` with a `.json` beside it (rank, devices, why), becomes
/// one trace per process and device, named as the live recorder names them. One line each.
pub fn convert_histories(dir: &Path, output: &Path, capacity: Option<&str>) -> Vec<String> {
    use crate::source::import::torch::{import_file, ImportOptions};
    let mut lines = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return lines };
    let mut pickles: Vec<PathBuf> =
        rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
    pickles.sort();
    for pickle in pickles {
        let meta: serde_json::Value = std::fs::read_to_string(pickle.with_extension("json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let num = |k: &str| meta.get(k).and_then(serde_json::Value::as_u64).and_then(|v| u32::try_from(v).ok());
        let devices: Vec<u32> = meta
            .get("devices")
            .and_then(|d| d.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())).collect())
            .unwrap_or_else(|| vec![0]);
        let why = meta.get("reason").and_then(|v| v.as_str()).unwrap_or("exit").to_string();
        for (i, &device) in devices.iter().enumerate() {
            let placement = recorder::trace::Placement {
                device_index: Some(device),
                rank: num("rank"),
                local_rank: num("local_rank"),
                world_size: num("world_size"),
            };
            let path = recorder::ffi::trace_path(&output.to_string_lossy(), &placement, device as i32, i == 0);
            let import = ImportOptions {
                device: device as usize,
                // --capacity, else the limit the job set itself (its memory fraction, lifted).
                capacity_bytes: capacity
                    .and_then(|c| recorder::engine::config::parse_bytes(c).ok())
                    .or_else(|| meta.get("capacity").and_then(serde_json::Value::as_u64)),
                ..Default::default()
            };
            let result = import_file(&pickle, &import).map_err(anyhow::Error::from).and_then(|mut imported| {
                imported.header.placement = placement;
                imported.header.source = recorder::trace::Source::Recorded;
                imported.header.notes.push(format!(
                    "PyTorch's caching allocator ran the job; converted from its allocator history, dumped at {why} \
                     (the live helper could not be used)"
                ));
                // Written whole or not at all: beside the trace, then renamed into place.
                let pending = crate::model::output::Pending::new(std::path::Path::new(&path))?;
                let mut w = TraceWriter::create(pending.temp_path(), &imported.header)?;
                for r in &imported.records {
                    w.write(r)?;
                }
                w.finish()?;
                pending.commit()?;
                Ok(imported.report.entries)
            });
            lines.push(match result {
                Ok(_) => super::record::summary(&path, None).replace(
                    "; the recorder did not report (the program did not use CUDA through PyTorch, or was killed)",
                    &format!("; from PyTorch's history dumped at {why} (a kill -9 loses it)"),
                ),
                Err(e) => format!("alloctrace: cannot convert PyTorch's history {}: {e}", pickle.display()),
            });
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dumped history becomes a trace at the recorder's path, written whole (beside it, then
    /// renamed: no temporary file is left), with the dump's reason in its notes.
    #[test]
    fn a_dumped_history_becomes_a_whole_trace() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch/frag_oom.default.pickle");
        std::fs::copy(&snapshot, dir.path().join("snapshot.1.pickle")).unwrap();
        std::fs::write(dir.path().join("snapshot.1.json"), r#"{"reason": "oom", "devices": [0]}"#).unwrap();
        let out_dir = tempfile::tempdir().unwrap();
        let output = out_dir.path().join("run.atrace");
        let lines = convert_histories(dir.path(), &output, None);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("dumped at oom"), "{lines:?}");
        let trace = crate::model::Trace::open(&output).unwrap();
        assert!(trace.header.notes.iter().any(|n| n.contains("dumped at oom")));
        let names: Vec<String> = std::fs::read_dir(out_dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        assert_eq!(names, ["run.atrace"]);
    }
}
