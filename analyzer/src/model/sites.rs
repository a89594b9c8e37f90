//! Call sites: the one naming rule and the one interner, filled once when a trace is read
//! ([`crate::model::Facts::sites`]); every analysis takes its names from there.
//!
//! A call site is named as memory_viz shows a stack: by the innermost frame in *model code*, with
//! the user's own line beside it where the two differ. Model code is any frame that is neither
//! PyTorch's own (`torch/...`), the Python runtime's nor the recorder's: a module's forward in
//! the user's code or in a model library (transformers' `modeling_*.py`, torchvision, timm), or
//! the training loop that calls the optimizer. The user's line is the innermost frame outside
//! installed packages. So a tensor made inside `torch/nn/modules/linear.py` for the MLP of a
//! Hugging Face model called from `loss = model(...)` in `train.py` is charged to
//! `transformers/models/gpt2/modeling_gpt2.py:NNN (forward) via train.py:57 (main)`; where the
//! model is the user's own code, to `train.py:NNN (forward)`. The name is what every output shows
//! (text, SVG, JSON), and two call-site ids with the same name are one site. The recorder's own
//! files (its Python shim) are never named.
//!
//! A name holds the trace's strings as they are (a function name may hold a newline): JSON
//! carries it so, and each writer of another output escapes it there ([`crate::model::escape`]).

use recorder::trace::{Event, Frame};
use serde::Serialize;
use std::collections::HashMap;

/// A place in the program, named by its innermost user frame.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    /// `FILE:LINE (function)`, or `(no call site recorded)`; raw (see the module documentation).
    pub label: String,
    /// The model frame's file, line and function; JSON `null` where no call site was recorded
    /// (unknown is null, never `""` or `0`).
    #[serde(serialize_with = "empty_is_null")]
    pub file: String,
    #[serde(serialize_with = "zero_is_null")]
    pub line: u32,
    #[serde(serialize_with = "empty_is_null")]
    pub function: String,
}

fn empty_is_null<S: serde::Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
    if v.is_empty() {
        s.serialize_none()
    } else {
        s.serialize_str(v)
    }
}

fn zero_is_null<S: serde::Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
    if *v == 0 {
        s.serialize_none()
    } else {
        s.serialize_u32(*v)
    }
}

impl Site {
    pub fn unknown() -> Self {
        Site { label: "(no call site recorded)".into(), file: String::new(), line: 0, function: String::new() }
    }

    /// Whether the trace named where these blocks were allocated.
    pub fn is_known(&self) -> bool {
        !self.file.is_empty()
    }

    /// The named frame alone, without the user's line beside it (for a line that lists several
    /// sites): `transformers/activations.py:56 (forward)`.
    pub fn frame_label(&self) -> String {
        if self.file.is_empty() {
            return self.label.clone();
        }
        frame_text(&self.file, self.line, &self.function)
    }
}

/// Frames of the recorder's own Python shim: never the program's.
fn is_recorder_frame(file: &str) -> bool {
    let name = file.rsplit(['/', '\\']).next().unwrap_or(file);
    name == "alloctrace_hook.py"
}

/// Frames of PyTorch itself and of the Python runtime (and C/C++ frames): what model code calls,
/// never model code.
fn is_torch_or_runtime_frame(file: &str) -> bool {
    let f = file.replace('\\', "/");
    // In an installed package, the package's own path decides (a virtualenv may itself live in a
    // folder named torch); elsewhere, a source checkout's `torch/` folder.
    let installed = short_file(&f);
    let torch = if installed.len() < f.len() {
        installed.starts_with("torch/")
    } else {
        f.starts_with("torch/") || f.contains("/torch/")
    };
    let runtime = f.contains("/lib/python") && installed.len() == f.len();
    runtime
        || torch
        || f.starts_with('<')
        || f.ends_with(".cpp")
        || f.ends_with(".cu")
        || f.ends_with(".h")
        || f.ends_with(".hpp")
        || is_recorder_frame(&f)
}

/// Frames of the Python runtime, installed packages and PyTorch itself: not the user's code.
pub fn is_library_frame(file: &str) -> bool {
    let f = file.replace('\\', "/");
    f.contains("site-packages/") || f.contains("dist-packages/") || is_torch_or_runtime_frame(&f)
}

/// The innermost user frame (frames are innermost first), else the innermost frame.
pub fn user_frame(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|f| !is_library_frame(&f.file)).or(frames.first())
}

/// The innermost frame in model code (see the module documentation), if any.
pub fn model_frame(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|f| !is_torch_or_runtime_frame(&f.file))
}

/// A file as a label shows it: an installed package's path from the package on.
fn short_file(file: &str) -> &str {
    ["site-packages/", "dist-packages/"]
        .iter()
        .find_map(|p| file.rfind(p).map(|k| &file[k + p.len()..]))
        .unwrap_or(file)
}

/// One frame as a label names it: `transformers/activations.py:56 (forward)`. A frame without a
/// line (0) is named without one: a predicted trace's call site is the module and the operator,
/// `layer1.0.conv1 (aten.convolution.default)`; a frame with no file either, `(forward)`.
fn frame_text(file: &str, line: u32, function: &str) -> String {
    let file = short_file(file);
    match (file.is_empty(), line) {
        (true, 0) => format!("({function})"),
        (false, 0) => format!("{file} ({function})"),
        _ => format!("{file}:{line} ({function})"),
    }
}

pub fn site_of(frames: &[Frame]) -> Site {
    let user = frames.iter().find(|f| !is_library_frame(&f.file));
    let fallback = frames.iter().find(|f| !is_recorder_frame(&f.file));
    let Some(named) = model_frame(frames).or(user).or(fallback) else { return Site::unknown() };
    let mut label = frame_text(&named.file, named.line, &named.function);
    if let Some(u) = user.filter(|u| *u != named) {
        label.push_str(&format!(" via {}:{} ({})", u.file, u.line, u.function));
    }
    Site { label, file: named.file.clone(), line: named.line, function: named.function.clone() }
}

/// Call sites of a trace, deduplicated by their name ([`site_of`]). Index 0 is "no call site".
#[derive(Debug, Clone)]
pub struct Sites {
    pub sites: Vec<Site>,
    by_callsite: HashMap<u32, usize>,
    by_label: HashMap<String, usize>,
    /// Whether the trace defined any call site (even one with no frames).
    defined: bool,
}

impl Default for Sites {
    fn default() -> Self {
        let unknown = Site::unknown();
        Sites {
            by_label: HashMap::from([(unknown.label.clone(), 0)]),
            sites: vec![unknown],
            by_callsite: HashMap::new(),
            defined: false,
        }
    }
}

impl Sites {
    /// Interns the call site `callsite` (an `Event::CallSite`); [`Sites::of`] gives its index.
    pub fn define(&mut self, callsite: u32, frames: &[Frame]) {
        self.defined = true;
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
    /// Whether the trace defined any call site.
    pub fn any_defined(&self) -> bool {
        self.defined
    }
    /// The name of site `idx`.
    pub fn label(&self, idx: usize) -> &str {
        &self.sites[idx].label
    }
}

/// Live requested bytes per call site, folded over a trace's records in order: the fold that
/// `plot`'s live bytes by call site and `diff`'s per-site figures share. Vectors are indexed
/// by site ([`Sites::of`]) of the trace's sites ([`crate::model::Facts::sites`]).
#[derive(Debug)]
pub struct LiveBySite<'a> {
    pub sites: &'a Sites,
    /// Each live allocation's site and requested bytes.
    live: crate::model::ids::IdMap<(usize, u64)>,
    /// Live requested bytes now.
    pub current: Vec<u64>,
    /// The most live requested bytes at once.
    pub most: Vec<u64>,
    /// Allocations made.
    pub allocations: Vec<u64>,
    /// Live requested bytes now, over every site.
    pub total: u64,
}

impl crate::model::fold::Fold for LiveBySite<'_> {
    fn observe(&mut self, _: u64, r: &recorder::trace::Record) {
        LiveBySite::observe(self, &r.event)
    }
}

impl<'a> LiveBySite<'a> {
    pub fn new(sites: &'a Sites) -> Self {
        let n = sites.len();
        LiveBySite {
            sites,
            live: Default::default(),
            current: vec![0; n],
            most: vec![0; n],
            allocations: vec![0; n],
            total: 0,
        }
    }

    /// Takes one record's event.
    pub fn observe(&mut self, e: &Event) {
        match e {
            Event::Alloc { id, requested_bytes, callsite, .. } => {
                let l = self.sites.of(*callsite);
                self.live.insert(*id, (l, *requested_bytes));
                self.current[l] = self.current[l].saturating_add(*requested_bytes);
                self.most[l] = self.most[l].max(self.current[l]);
                self.allocations[l] += 1;
                self.total = self.total.saturating_add(*requested_bytes);
            }
            Event::FreeCompleted { id, .. } => {
                if let Some((l, b)) = self.live.remove(id) {
                    self.current[l] = self.current[l].saturating_sub(b);
                    self.total = self.total.saturating_sub(b);
                }
            }
            _ => {}
        }
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
    fn a_model_library_frame_is_named_with_the_users_line() {
        // As a Hugging Face GPT-2 MLP allocates, called from a training script.
        let frames = vec![
            frame("/opt/venv/lib/python3.12/site-packages/torch/nn/functional.py", 1700, "gelu"),
            frame("/opt/venv/lib/python3.12/site-packages/transformers/activations.py", 56, "forward"),
            frame("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1790, "_call_impl"),
            frame("/opt/venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py", 312, "forward"),
            frame("train.py", 57, "main"),
        ];
        let s = site_of(&frames);
        assert_eq!(s.label, "transformers/activations.py:56 (forward) via train.py:57 (main)");
        // A virtualenv in a folder named torch: the package path decides.
        let venv: Vec<Frame> = frames
            .iter()
            .map(|f| frame(&f.file.replace("/opt/venv/", "/opt/torch/.venv/"), f.line, &f.function))
            .collect();
        assert_eq!(site_of(&venv).label, s.label);
        assert_eq!((s.line, s.function.as_str()), (56, "forward"));
        // The recorder's shim is never named; the user's own module is named alone.
        let frames = vec![
            frame("/tmp/alloctrace-x1/alloctrace_hook.py", 135, "backward"),
            frame("model.py", 20, "forward"),
            frame("/usr/lib/python3.12/site-packages/torch/nn/modules/module.py", 1790, "_call_impl"),
            frame("train.py", 9, "step"),
        ];
        assert_eq!(site_of(&frames).label, "model.py:20 (forward)");
        // Only the recorder's frame: no call site.
        assert_eq!(site_of(&frames[..1]).label, "(no call site recorded)");
    }

    /// A frame without a line is named without one: a predicted trace's module and operator,
    /// autograd's node (PyTorch's backward thread has no Python stack), a frame with no file.
    /// `explain` named a predicted request's site without the line, and the table of sites
    /// with `:0`, in one document.
    #[test]
    fn frames_without_a_line_are_named_without_one() {
        let predicted = [frame("layer1.0.conv1", 0, "aten.convolution.default")];
        assert_eq!(site_of(&predicted).label, "layer1.0.conv1 (aten.convolution.default)");
        assert_eq!(site_of(&[frame("<autograd>", 0, "MmBackward0")]).label, "<autograd> (MmBackward0)");
        assert_eq!(site_of(&[frame("", 0, "forward")]).label, "(forward)");
        assert_eq!(site_of(&[frame("model.py", 0, "forward")]).frame_label(), "model.py (forward)");
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

    /// The name keeps the trace's characters (the writer of each output escapes them), and two
    /// functions that differ only where an escape would look alike stay two sites.
    #[test]
    fn names_are_raw_and_distinct() {
        let mut s = Sites::default();
        s.define(1, &[frame("a.py", 5, "f\ng\t`**")]);
        s.define(2, &[frame("a.py", 5, "f\\ng\\t`**")]);
        assert_eq!(s.label(s.of(1)), "a.py:5 (f\ng\t`**)");
        assert_eq!(s.sites[s.of(1)].frame_label(), "a.py:5 (f\ng\t`**)");
        assert_ne!(s.of(1), s.of(2));
    }
}
