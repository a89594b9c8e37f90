//! Writing outputs without destroying inputs.
//!
//! - An output that is one of the command's inputs (the same file by device and inode, so also
//!   through a symlink or a hard link) is refused before anything is read or written.
//! - Every file is written to a temporary file in its own folder and renamed into place: an
//!   interrupted command leaves the old file or the new one, never half of one. The rename
//!   replaces a symlink planted at the output path instead of writing through it.
//! - A report goes into an empty folder, a new one, or a previous report's; anything else needs
//!   `--force`.

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
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(dir)
            .with_context(|| format!("cannot write {}", path.display()))?;
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

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut p = Pending::new(path)?;
    p.file().write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
    p.file().sync_all().ok();
    p.commit()
}

/// The files `report` writes into its folder, besides the pictures (`*.svg`).
pub const REPORT_FILES: [&str; 3] = ["report.md", "report.html", "summary.json"];

/// Checks that `dir` may receive a report: missing, empty, a previous report (only a report's
/// files), or `force`.
pub fn check_report_dir(dir: &Path, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    let mut others = Vec::new();
    let mut any_report_file = false;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if REPORT_FILES.contains(&name.as_str()) {
            any_report_file = true;
        } else if !(name.ends_with(".svg") || name.ends_with(".png")) {
            others.push(name);
        }
    }
    let is_report = any_report_file && others.is_empty();
    let empty = !any_report_file && others.is_empty();
    if !(empty || is_report) {
        let mut shown: Vec<&str> = others.iter().map(|s| s.as_str()).take(3).collect();
        shown.sort_unstable();
        bail!(
            "{}: the folder holds files that are not a report's ({}{}); choose an empty folder, or pass --force to \
             write the report there anyway",
            dir.display(),
            shown.join(", "),
            if others.len() > 3 { ", ..." } else { "" }
        );
    }
    Ok(())
}
