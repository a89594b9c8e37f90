//! Writing outputs without destroying inputs, and the shapes every output shares: the JSON
//! envelope of every `--json` output and of `summary.json` ([`json`]), and the blocks of a
//! report's document ([`document`]), below every analysis.
//!
//! Writing:
//! - An output that is one of the command's inputs (the same file by device and inode, so also
//!   through a symlink or a hard link) is refused before anything is read or written.
//! - Every file is written to a temporary file in its own folder and renamed into place: an
//!   interrupted command leaves the old file or the new one, never half of one. The rename
//!   replaces a symlink planted at the output path instead of writing through it.
//! - A file output replaces only an empty file or one of its own kind ([`check_output_file`]): a
//!   trace, a picture or an export, never notes given as `-o` by mistake; an export replaces
//!   only one that alloctrace wrote (never a PyTorch snapshot), and no read-only file is replaced.
//! - A report goes into an empty folder, a new one, or a previous report's; anything else needs
//!   `--force`.

pub mod document;
pub mod json;

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Device and inode of an existing file (following symlinks), if it exists.
fn identity(p: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        std::fs::canonicalize(p).ok().map(|c| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            c.hash(&mut h);
            (0, h.finish())
        })
    }
}

/// Refuses an output that is one of the inputs (also through a symlink or a hard link).
pub fn refuse_input(output: &Path, inputs: &[&Path]) -> Result<()> {
    let Some(out) = identity(output) else { return Ok(()) };
    for input in inputs {
        if identity(input) == Some(out) {
            bail!(
                "{}: the output is the input {} (the same file); writing it would destroy the input: choose \
                 another output path",
                output.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// What an output file holds: an existing file at an output's path is replaced only where it
/// holds that (a command's earlier output), never a file of another kind ([`check_output_file`]).
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Trace,
    Svg,
    Png,
    /// A JSON document of alloctrace's own (the envelope: `schema_version` first).
    Json,
    /// A Perfetto export (`export --format perfetto`).
    Perfetto,
    /// A memory-viz export (`export --format memory-viz`): a PyTorch snapshot that alloctrace
    /// wrote, never one PyTorch wrote (the evidence a user is debugging).
    Pickle,
}

/// How alloctrace's memory-viz exports begin (pickle protocol 2, `device_traces` first);
/// PyTorch's own snapshots begin otherwise (protocol 4, `segments` first).
pub const MEMORY_VIZ_HEAD: &[u8] = b"\x80\x02}(X\x0d\x00\x00\x00device_traces";

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Trace => "an alloctrace trace",
            Kind::Svg => "an SVG picture",
            Kind::Png => "a PNG picture",
            Kind::Json => "alloctrace's JSON",
            Kind::Perfetto => "alloctrace's Perfetto export",
            Kind::Pickle => "alloctrace's memory-viz export (a PyTorch snapshot is never replaced)",
        }
    }

    /// Whether a file beginning with `head` (its first [`HEAD_BYTES`]) holds this kind.
    fn holds(self, head: &[u8]) -> bool {
        let text = String::from_utf8_lossy(head);
        let text = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
        match self {
            Kind::Trace => head.starts_with(&recorder::trace::MAGIC),
            Kind::Svg => text.starts_with("<?xml") || text.starts_with("<svg"),
            Kind::Png => head.starts_with(b"\x89PNG"),
            Kind::Json => text.strip_prefix('{').is_some_and(|t| t.trim_start().starts_with("\"schema_version\"")),
            Kind::Perfetto => text.starts_with("{\"traceEvents\":[") && text.contains("\"alloctrace: "),
            Kind::Pickle => head.starts_with(MEMORY_VIZ_HEAD),
        }
    }
}

/// How much of an existing file [`Kind::holds`] reads.
const HEAD_BYTES: u64 = 128;

/// The checks before a command writes the file `output` of `kind`: it is none of the `inputs`
/// ([`refuse_input`]), and a file already there is empty or of its kind.
pub fn check_output_file(output: &Path, inputs: &[&Path], kind: Kind) -> Result<()> {
    refuse_input(output, inputs)?;
    refuse_foreign(output, kind)
}

/// Refuses to replace an existing file that is not of the output's kind (notes given as `-o`
/// by mistake): a command replaces only what it could have written, or an empty file.
fn refuse_foreign(output: &Path, kind: Kind) -> Result<()> {
    let Ok(meta) = std::fs::metadata(output) else { return Ok(()) };
    if meta.is_dir() {
        bail!("{}: is a folder; give the path of a file", output.display());
    }
    if meta.permissions().readonly() {
        bail!("{}: the file is read-only; alloctrace does not replace it: choose another path", output.display());
    }
    let mut head = Vec::with_capacity(HEAD_BYTES as usize);
    if let Ok(f) = std::fs::File::open(output) {
        use std::io::Read;
        let _ = f.take(HEAD_BYTES).read_to_end(&mut head);
    }
    // A recording cannot be made again: an import, a replay or a synthetic trace never replaces
    // one (`alloctrace record` writes its own).
    if matches!(kind, Kind::Trace) && kind.holds(&head) {
        let recorded = recorder::trace::TraceReader::open(output)
            .is_ok_and(|r| r.header().source == recorder::trace::Source::Recorded);
        if recorded {
            bail!(
                "{}: is a recording (alloctrace record), which cannot be made again; alloctrace does not replace \
                 it: choose another path",
                output.display()
            );
        }
    }
    if meta.len() > 0 && !kind.holds(&head) {
        bail!(
            "{}: the file exists and is not {}; alloctrace replaces only its own outputs: remove it or choose \
             another path",
            output.display(),
            kind.describe()
        );
    }
    Ok(())
}

/// A file being written next to its final path, renamed there by [`Pending::commit`]; dropped
/// without a commit, it is removed.
pub struct Pending {
    temp: tempfile::NamedTempFile,
    path: PathBuf,
}

impl Pending {
    pub fn new(path: &Path) -> Result<Pending> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            bail!("cannot write {}: the folder {} does not exist", path.display(), dir.display());
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let prefix = format!(".{name}.");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".partial");
        // A temporary file is private (0600); the output is a file like any other, readable as
        // the user's umask allows (0666 less the umask, as `File::create` makes it).
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let temp = builder.tempfile_in(dir).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Pending { temp, path: path.to_path_buf() })
    }

    /// Where to write meanwhile.
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    pub fn file(&mut self) -> &mut std::fs::File {
        self.temp.as_file_mut()
    }

    /// Renames the finished file into place.
    pub fn commit(self) -> Result<()> {
        let path = self.path;
        self.temp
            .persist(&path)
            .map_err(|e| anyhow::Error::new(e.error).context(format!("cannot write {}", path.display())))?;
        Ok(())
    }
}

/// The kind of picture an output path asks for: a PNG where its name ends in `.png`, an SVG where
/// it ends in `.svg` or has no extension; another extension is refused.
pub fn picture_kind(path: &Path) -> Result<Kind> {
    match path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()) {
        Some(e) if e == "png" => Ok(Kind::Png),
        Some(e) if e == "svg" => Ok(Kind::Svg),
        None => Ok(Kind::Svg),
        // An SVG under another name (`out.pdf`) is a file that its name misdescribes.
        Some(e) => bail!("{}: alloctrace draws SVG or PNG, not .{e}: name the picture .svg or .png", path.display()),
    }
}

/// Refuses an export whose name says another format (a pickle named `.json`), which misleads
/// whoever opens it; pictures are named by [`picture_kind`].
pub fn refuse_misnamed(path: &Path, kind: Kind) -> Result<()> {
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let (wrong, writes): (&[&str], &str) = match kind {
        Kind::Pickle => (&["json", "html", "svg", "png", "atrace"], "a PyTorch snapshot pickle: name it .pickle"),
        Kind::Perfetto => {
            (&["pickle", "pkl", "html", "svg", "png", "atrace"], "Chrome trace-event JSON: name it .json")
        }
        _ => (&[], ""),
    };
    if wrong.contains(&ext.as_str()) {
        bail!("{}: this export writes {writes}, not .{ext}", path.display());
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut p = Pending::new(path)?;
    p.file().write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
    p.file().sync_all().ok();
    p.commit()
}

/// Largest file a report writes: with its 3 documents and at most 7 pictures (with categories
/// and ranks), each as SVG and PNG, a report is at most 17 times this.
pub const MAX_REPORT_FILE_BYTES: usize = 16 << 20;

/// An output that would pass its stated bound ([`MAX_REPORT_FILE_BYTES`] for a report's file,
/// `cmd::export::MAX_EXPORT_BYTES` for an export): refused, with exit code 3, and nothing is left at
/// its path. The message says which output, how large it would be and the bound.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TooLarge(pub String);

impl TooLarge {
    /// Whether `e` (or what caused it, through an I/O error) is an output past its bound.
    pub fn is_cause_of(e: &anyhow::Error) -> bool {
        e.chain().any(|c| {
            c.is::<TooLarge>()
                || c.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).is_some_and(|i| i.is::<TooLarge>())
        })
    }
}

/// The files `report` writes into its folder, besides the pictures (`*.svg`, `*.png`).
pub const REPORT_FILES: [&str; 3] = ["report.md", "report.html", "summary.json"];

/// Whether `name` is one of the files a report writes (its documents or a picture).
fn is_report_name(name: &str) -> bool {
    REPORT_FILES.contains(&name) || name.ends_with(".svg") || name.ends_with(".png")
}

/// Whether `path` is the `summary.json` of a report: a JSON object whose `environment` names the
/// version of the tool that wrote the report. A file with a report's name alone is not enough:
/// the user's own `summary.json` must not be taken for one.
fn is_report_summary(path: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if !meta.is_file() || meta.len() > MAX_REPORT_FILE_BYTES as u64 {
        return false;
    }
    let Ok(bytes) = std::fs::read(path) else { return false };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return false };
    v.get("schema_version").is_some_and(|s| s.is_u64())
        && v.get("environment").and_then(|e| e.get("report_tool_version")).is_some_and(|s| s.is_string())
}

/// Writes a report's `files` (name, bytes) into the folder `dir`, creating it, each through a
/// temporary file and a rename ([`write_file`]), never onto one of `inputs`. Whatever the trace
/// holds, a report is a bounded amount (see the README): all of it or, where one file would pass
/// [`MAX_REPORT_FILE_BYTES`], an error ([`TooLarge`]) and no file. Returns the paths written.
pub fn write_report(dir: &Path, inputs: &[&Path], files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>> {
    if let Some((name, body)) = files.iter().find(|(_, b)| b.len() > MAX_REPORT_FILE_BYTES) {
        return Err(TooLarge(format!(
            "{} would be {} bytes, more than the {MAX_REPORT_FILE_BYTES} a report file may hold; no file of the \
             report was written",
            dir.join(name).display(),
            body.len()
        ))
        .into());
    }
    // A report is a folder: a file there (the input trace given as -o by mistake) is refused by
    // name before anything else.
    if dir.is_file() {
        refuse_input(dir, inputs)?;
        bail!("{}: is a file; a report is a folder of files: give a folder's path", dir.display());
    }
    // An earlier report's files that this one does not write (a picture of categories the new
    // trace has none of) would be taken for this report's: they go once it is written. Only in a
    // folder that is an earlier report, never in one written with --force.
    let earlier = earlier_report_files(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, body) in files {
        let p = dir.join(name);
        refuse_input(&p, inputs)?;
        write_file(&p, body)?;
        written.push(p);
    }
    for name in earlier.iter().filter(|n| !files.iter().any(|(f, _)| f == *n)) {
        let p = dir.join(name);
        std::fs::remove_file(&p).with_context(|| format!("cannot remove the earlier report's {}", p.display()))?;
    }
    Ok(written)
}

/// The files of the earlier report that `dir` holds, if it is one ([`is_earlier_report`]).
fn earlier_report_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let names: Vec<String> =
        entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    if is_earlier_report(dir, &names) {
        names
    } else {
        Vec::new()
    }
}

/// Whether the folder `dir`, holding the files `names`, is an earlier report: its `summary.json`
/// is a report's and it holds nothing but a report's files.
fn is_earlier_report(dir: &Path, names: &[String]) -> bool {
    is_report_summary(&dir.join("summary.json")) && names.iter().all(|n| is_report_name(n))
}

/// Checks that `dir` may receive a report: missing, empty, a previous report, or `force`. A
/// previous report is a folder whose `summary.json` is a report's and which holds nothing but a
/// report's files; a folder holding only files with a report's names, without that mark, is
/// someone else's. Whatever `force` says, a file of the folder that is one of `inputs` is refused.
pub fn check_report_dir(dir: &Path, inputs: &[&Path], force: bool) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    let mut names = Vec::new();
    for e in entries {
        let e = e.with_context(|| format!("cannot read the folder {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if is_report_name(&name) {
            refuse_input(&dir.join(&name), inputs)?;
        }
        names.push(name);
    }
    if force || names.is_empty() {
        return Ok(());
    }
    if !is_earlier_report(dir, &names) {
        let mut shown: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        shown.sort_unstable();
        let more = shown.len() > 3;
        shown.truncate(3);
        bail!(
            "{}: the folder is not empty and holds no earlier report ({}{}); choose an empty folder, or pass \
             --force to write the report there anyway (files with a report's names are replaced)",
            dir.display(),
            shown.join(", "),
            if more { ", ..." } else { "" }
        );
    }
    Ok(())
}
