//! Call sites: the one naming rule and the one interner.
//!
//! A call site is named by its innermost *user* frame: frames from the Python standard library,
//! site-packages and PyTorch's own sources are skipped, so a tensor made inside
//! `torch/nn/modules/linear.py` for `out = m(x)` is charged to the line `out = m(x)`. The name,
//! `FILE:LINE (function)`, is what every output shows (text, SVG, JSON), and two call-site ids
//! with the same name are one site.

use recorder::trace::Frame;
use serde::Serialize;
use std::collections::HashMap;

/// A place in the program, named by its innermost user frame.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    /// `FILE:LINE (function)`, or `(no call site recorded)`.
    pub label: String,
    pub file: String,
    pub line: u32,
    pub function: String,
}

impl Site {
    pub fn unknown() -> Self {
        Site { label: "(no call site recorded)".into(), file: String::new(), line: 0, function: String::new() }
    }
}

/// Frames of the Python runtime, installed packages and PyTorch itself: not the user's code.
pub fn is_library_frame(file: &str) -> bool {
    let f = file.replace('\\', "/");
    f.contains("site-packages/")
        || f.contains("dist-packages/")
        || f.contains("/lib/python")
        || f.starts_with("torch/")
        || f.contains("/torch/")
        || f.starts_with('<')
        || f.ends_with(".cpp")
        || f.ends_with(".cu")
        || f.ends_with(".h")
        || f.ends_with(".hpp")
}

/// The innermost user frame (frames are innermost first), else the innermost frame.
pub fn user_frame(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|f| !is_library_frame(&f.file)).or(frames.first())
}

pub fn site_of(frames: &[Frame]) -> Site {
    match user_frame(frames) {
        Some(f) => Site {
            // One line whatever the trace holds: the label is printed and put in reports.
            label: crate::escape::terminal(&format!("{}:{} ({})", f.file, f.line, f.function)).into_owned(),
            file: f.file.clone(),
            line: f.line,
            function: f.function.clone(),
        },
        None => Site::unknown(),
    }
}

/// Call sites of a trace, deduplicated by their name ([`site_of`]). Index 0 is "no call site".
#[derive(Debug, Clone)]
pub struct Sites {
    pub sites: Vec<Site>,
    by_callsite: HashMap<u32, usize>,
    by_label: HashMap<String, usize>,
}

impl Default for Sites {
    fn default() -> Self {
        let unknown = Site::unknown();
        Sites {
            by_label: HashMap::from([(unknown.label.clone(), 0)]),
            sites: vec![unknown],
            by_callsite: HashMap::new(),
        }
    }
}

impl Sites {
    /// Interns the call site `callsite` (an `Event::CallSite`); [`Sites::of`] gives its index.
    pub fn define(&mut self, callsite: u32, frames: &[Frame]) {
        let site = site_of(frames);
        let n = self.sites.len();
        let idx = *self.by_label.entry(site.label.clone()).or_insert(n);
        if idx == n {
            self.sites.push(site);
        }
        self.by_callsite.insert(callsite, idx);
    }
    /// The site index of a call-site id (0 when unknown).
    pub fn of(&self, callsite: u32) -> usize {
        self.by_callsite.get(&callsite).copied().unwrap_or(0)
    }
    /// The number of sites (with "no call site").
    pub fn len(&self) -> usize {
        self.sites.len()
    }
    /// Never: "no call site" is always there.
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }
    /// The name of site `idx`.
    pub fn label(&self, idx: usize) -> &str {
        &self.sites[idx].label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: u32, function: &str) -> Frame {
        Frame { file: file.into(), line, function: function.into() }
    }

    #[test]
    fn user_frame_skips_torch_internals() {
        let frames = vec![
            frame("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 134, "forward"),
            frame("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1790, "_call_impl"),
            frame("workloads.py", 81, "leak_list_append"),
            frame("workloads.py", 141, "<module>"),
        ];
        assert_eq!(site_of(&frames).label, "workloads.py:81 (leak_list_append)");
        // Only library frames: the innermost one.
        assert_eq!(site_of(&frames[..1]).line, 134);
        assert_eq!(site_of(&[]).label, "(no call site recorded)");
    }

    #[test]
    fn sites_deduplicate_by_user_frame() {
        let mut s = Sites::default();
        s.define(3, &[frame("torch/nn/functional.py", 1, "relu"), frame("a.py", 5, "f")]);
        s.define(4, &[frame("torch/nn/linear.py", 2, "forward"), frame("a.py", 5, "f")]);
        assert_eq!(s.of(3), s.of(4));
        assert_eq!(s.of(99), 0);
        assert_eq!(s.label(s.of(3)), "a.py:5 (f)");
        assert_eq!(s.len(), 2);
    }
}
