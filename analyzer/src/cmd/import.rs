//! `alloctrace import torch SNAPSHOT.pickle -o OUT.atrace`: converts a PyTorch memory snapshot
//! (`torch.cuda.memory._dump_snapshot`) into a trace.

use super::{exit, write_json};
use crate::source::import::torch::ImportOptions;
use anyhow::{Context, Result};
use recorder::trace::TraceWriter;
use std::io::Write;
use std::path::PathBuf;

pub struct ImportCmdOptions {
    pub snapshot: PathBuf,
    pub output: PathBuf,
    pub import: ImportOptions,
    pub json: bool,
}

pub fn run(opts: &ImportCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let started = std::time::Instant::now();
    crate::model::output::check_output_file(&opts.output, &[&opts.snapshot], crate::model::output::Kind::Trace)?;
    let mut imported = crate::source::input::import_as_analysed(&opts.snapshot, &opts.import, None)?;
    // The limit every command assumes of it, where the limit is inferred as a range: its cache
    // releases are told apart against that one (see `super::open_input`).
    if opts.import.capacity_bytes.is_none() {
        let trace =
            crate::model::Trace::from_records(&opts.snapshot, imported.header.clone(), imported.records.clone());
        let read_at = |limit: u64| -> Result<Option<crate::model::Trace>> {
            let i = crate::source::input::import_as_analysed(&opts.snapshot, &opts.import, Some(limit))?;
            Ok(Some(crate::model::Trace::from_records(&opts.snapshot, i.header, i.records)))
        };
        if let Some(least) = crate::analysis::capacity_search::least_implied_limit(&trace, &read_at)? {
            imported = crate::source::input::import_as_analysed(&opts.snapshot, &opts.import, Some(least))?;
        }
    }
    let pending = crate::model::output::Pending::new(&opts.output)?;
    let mut w = TraceWriter::create(pending.temp_path(), &imported.header)
        .with_context(|| format!("cannot write {}", opts.output.display()))?;
    for r in &imported.records {
        w.write(r).with_context(|| format!("cannot write {}", opts.output.display()))?;
    }
    w.finish().with_context(|| format!("cannot write {}", opts.output.display()))?;
    pending.commit()?;
    let bytes = std::fs::metadata(&opts.output).map(|m| m.len()).unwrap_or(0);
    let rep = &imported.report;
    if opts.json {
        #[derive(serde::Serialize)]
        struct J<'a> {
            snapshot: String,
            output: String,
            output_bytes: u64,
            bytes_per_event: f64,
            #[serde(flatten)]
            report: &'a crate::source::import::torch::ImportReport,
        }
        write_json(
            out,
            &J {
                snapshot: opts.snapshot.display().to_string(),
                output: opts.output.display().to_string(),
                output_bytes: bytes,
                bytes_per_event: bytes as f64 / rep.events.max(1) as f64,
                report: rep,
            },
        )?;
    } else {
        writeln!(
            out,
            "imported {} trace entries into {} events ({} call sites) in {:.2} s",
            rep.entries,
            rep.events,
            rep.callsites,
            started.elapsed().as_secs_f64()
        )?;
        writeln!(
            out,
            "wrote {} ({} bytes, {:.2} bytes per event)",
            opts.output.display(),
            bytes,
            bytes as f64 / rep.events.max(1) as f64
        )?;
        if rep.ring_buffer_overflowed {
            writeln!(
                out,
                "note: the snapshot's ring buffer had dropped its oldest entries; {} segments and {} live blocks from before the first entry were reconstructed from `segments`",
                rep.initial_segments, rep.initial_live_blocks
            )?;
        }
        if rep.inferred_empty_cache > 0 {
            writeln!(out, "note: {} empty_cache() calls inferred from segment-free bursts", rep.inferred_empty_cache)?;
        }
        for warning in &rep.warnings {
            writeln!(out, "warning: {}", crate::model::escape::terminal(warning))?;
        }
    }
    Ok(exit::OK)
}
