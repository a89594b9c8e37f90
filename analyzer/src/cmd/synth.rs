//! `alloctrace synth --events N --seed S -o OUT.atrace`: a deterministic synthetic trace.

use super::{exit, write_json};
use crate::model::units::fmt_bytes;
use crate::source::synth::{synth, SynthOptions};
use anyhow::Result;
use std::io::Write;

pub fn run(opts: &SynthOptions, json: bool, out: &mut dyn Write) -> Result<i32> {
    let started = std::time::Instant::now();
    // Written beside its path and renamed there: an interrupted run leaves no half trace, and a
    // file of another kind at the path is refused.
    crate::model::output::check_output_file(&opts.output, &[], crate::model::output::Kind::Trace)?;
    let pending = crate::model::output::Pending::new(&opts.output)?;
    let r = synth(&SynthOptions { output: pending.temp_path().to_path_buf(), ..opts.clone() })?;
    pending.commit()?;
    if json {
        write_json(out, &r)?;
    } else {
        let out = &mut crate::model::wrap::ScreenWriter::new(out);
        writeln!(
            out,
            "wrote {}: {} events ({} requests, {} iterations), {} ({:.2} bytes/event) in {:.1} s",
            opts.output.display(),
            r.events,
            r.requests,
            r.iterations,
            fmt_bytes(r.bytes),
            r.bytes as f64 / r.events.max(1) as f64,
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(exit::OK)
}
