//! Progress bars: one per command step, with a total, drawn on stderr when it is a terminal
//! (indicatif hides them otherwise).

use crate::model::Trace;
use indicatif::{ProgressBar, ProgressStyle};

/// A bar counting replays of `trace`; the caller sets its length once it knows how many.
pub fn replays(trace: &Trace) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} replays ({elapsed})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("what-if {}", trace.name()));
    bar
}
