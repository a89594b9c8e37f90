//! `alloctrace record -o run.atrace [--allocator pytorch|alloctrace] [--conf ...] [--capacity ...] [--after-limit N|end] [--stacks] -- python train.py`
//!
//! Runs the program with alloctrace's recorder installed in PyTorch: the Python shim (compiled
//! into the recorder crate) is written to a fresh private folder that goes first on
//! `PYTHONPATH`, and the environment tells it where the recorder's cdylib is and how to record.
//! By default PyTorch's own allocator runs the job and its events are streamed into the trace;
//! `--allocator alloctrace` runs alloctrace's engine instead. Each process and device of the
//! job writes a trace of its own (`NAME.rank{R}.atrace` under `torchrun`).
//! The program's output is its own; the exit code is the child's (128 + signal when killed).
//! Afterwards the trace is read back and one summary line goes to stderr, with a warning when
//! events were dropped (full disk, unwritable path) or the trace is incomplete.

use anyhow::{bail, Context, Result};
use recorder::recorder::shim;
use recorder::trace::{TraceEnd, TraceReader};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The options of `alloctrace record`.
#[derive(Clone, Debug, Default)]
pub struct RecordOptions {
    /// The trace to write.
    pub output: PathBuf,
    /// Allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax); default: what PyTorch reads from
    /// `PYTORCH_ALLOC_CONF` and `PYTORCH_CUDA_ALLOC_CONF`.
    pub conf: Option<String>,
    /// The memory limit, e.g. `40GiB` (PyTorch's memory fraction as a size). The engine
    /// back-end enforces it; the default back-end records it as the trace's capacity and lets
    /// PyTorch serve past it.
    pub capacity: Option<String>,
    /// The default back-end, past the limit: when to stop the job.
    pub after_limit: AfterLimit,
    /// Record Python call sites of every allocation.
    pub stacks: bool,
    /// The recorder's cdylib; default: `ALLOCTRACE_LIB`, else next to this executable.
    pub lib: Option<PathBuf>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// No summary line.
    pub quiet: bool,
    /// Which allocator runs the job.
    pub allocator: Allocator,
    /// Turns PyTorch's history, dumped where the default back-end's helper could not be used,
    /// into traces (`history folder, output, capacity`): one line each. The CLI's importer.
    pub convert_history: Option<ConvertHistory>,
}

/// See [`RecordOptions::convert_history`].
pub type ConvertHistory = fn(&Path, &Path, Option<&str>) -> Vec<String>;

/// With PyTorch's allocator past the limit: the job is stopped this many whole iterations after
/// it first went past it (default 3), or runs to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterLimit {
    Iterations(u32),
    End,
}

impl Default for AfterLimit {
    fn default() -> Self {
        AfterLimit::Iterations(3)
    }
}

impl std::str::FromStr for AfterLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("end") {
            return Ok(AfterLimit::End);
        }
        s.trim()
            .parse()
            .map(AfterLimit::Iterations)
            .map_err(|_| format!("`{s}` is neither a number of whole iterations nor `end`"))
    }
}

/// File names the recorder's cdylib may have.
const LIB_NAMES: [&str; 2] = ["liballoctrace_recorder.so", "librecorder.so"];

/// The recorder's cdylib near the folder of the `alloctrace` executable: beside it, in `../lib`
/// or `..` (a build or an install prefix), or in the Python package that shipped the executable
/// (`pip install` puts it in `bin/` and the library in
/// `lib/pythonX.Y/site-packages/alloctrace/lib/`).
fn lib_near(dir: &Path) -> Option<PathBuf> {
    let mut dirs = vec![dir.to_path_buf(), dir.join("../lib"), dir.join("..")];
    if let Ok(entries) = std::fs::read_dir(dir.join("../lib")) {
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .map(|e| e.path().join("site-packages/alloctrace/lib"))
            .collect();
        pythons.sort();
        dirs.extend(pythons);
    }
    for d in dirs {
        for n in LIB_NAMES {
            let p = d.join(n);
            if p.is_file() {
                return Some(p.canonicalize().unwrap_or(p));
            }
        }
    }
    None
}

/// Finds the recorder's cdylib.
pub fn find_lib(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("the recorder library {} does not exist", p.display());
    }
    if let Some(p) = std::env::var_os("ALLOCTRACE_LIB").map(PathBuf::from) {
        if p.is_file() {
            return Ok(p);
        }
    }
    let exe = std::env::current_exe().context("cannot locate the alloctrace executable")?;
    if let Some(p) = exe.parent().and_then(lib_near) {
        return Ok(p);
    }
    bail!(
        "cannot find the recorder library ({}) next to {}; build it with \
         `cargo build --release -p alloctrace-recorder --features cuda` or pass its path in ALLOCTRACE_LIB",
        LIB_NAMES.join(" or "),
        exe.display()
    )
}

/// Which allocator runs the job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Allocator {
    /// PyTorch's own caching allocator: the job runs exactly as natively, its events are
    /// streamed into the trace (a small helper built at first use), or, without a compiler,
    /// PyTorch's history is converted at exit.
    #[default]
    Pytorch,
    /// alloctrace's engine, through PyTorch's pluggable allocator: a policy runs for real, and
    /// splits and merges are recorded live.
    Alloctrace,
}

impl Allocator {
    fn env_value(self) -> &'static str {
        match self {
            Allocator::Pytorch => "pytorch",
            Allocator::Alloctrace => "alloctrace",
        }
    }
}

/// The private folder of one `record` run: a fresh directory with a random name, mode 0700,
/// created with `mkdir` (never an existing one, never through a link), holding the Python shim,
/// the recorders' status files and PyTorch's history when that is the fallback. Removed when
/// dropped.
struct RunDir(PathBuf);

impl RunDir {
    fn create() -> Result<Self> {
        use std::hash::{BuildHasher, Hasher};
        let base = std::env::temp_dir();
        check_temp_base(&base)?;
        let mut last = None;
        for attempt in 0..64u64 {
            // Random per process (the OS seeds RandomState); the name need not be secret: the
            // folder is created new and only its owner may enter it.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(attempt);
            h.write_u32(std::process::id());
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
            );
            let dir = base.join(format!("alloctrace-record-{:016x}", h.finish()));
            let mut b = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            match b.create(&dir) {
                Ok(()) => {
                    let d = RunDir(dir);
                    d.check()?;
                    for sub in ["python", "status", "history"] {
                        b.create(d.0.join(sub))
                            .with_context(|| format!("cannot create {}", d.0.join(sub).display()))?;
                    }
                    return Ok(d);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create a private folder in {}", base.display()))
                }
            }
        }
        Err(anyhow::anyhow!("cannot create a private folder in {}: {last:?}", base.display()))
    }

    /// The folder is a directory (not a link), ours, and closed to everyone else.
    fn check(&self) -> Result<()> {
        let m = std::fs::symlink_metadata(&self.0).with_context(|| format!("cannot inspect {}", self.0.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { getuid() };
            if !m.file_type().is_dir() || m.uid() != uid || m.permissions().mode() & 0o077 != 0 {
                bail!("refusing the private folder {}: not a directory of ours closed to others", self.0.display());
            }
        }
        #[cfg(not(unix))]
        if !m.file_type().is_dir() {
            bail!("refusing the private folder {}: not a directory", self.0.display());
        }
        Ok(())
    }
}

#[cfg(unix)]
extern "C" {
    fn getuid() -> u32;
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // remove_dir_all does not follow links inside the folder.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the program under the recorder; returns its exit code.
pub fn run(opts: &RecordOptions) -> Result<i32> {
    let Some((program, args)) = opts.command.split_first() else {
        bail!("no program to run: put it after `--`, e.g. `alloctrace record -o run.atrace -- python train.py`");
    };
    let output = std::path::absolute(&opts.output)
        .with_context(|| format!("cannot resolve the output path {}", opts.output.display()))?;
    check_writable(&output)?;
    check_inherited(opts)?;
    if opts.conf.is_none() {
        // The recorder takes its settings from PyTorch's variables then. PyTorch parses each one
        // that is set (PYTORCH_ALLOC_CONF for most keys, PYTORCH_CUDA_ALLOC_CONF for the CUDA
        // ones) and refuses a key it does not know in either: check them now, not after the job
        // has run with the defaults.
        for name in ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"] {
            if let Some(env) = std::env::var(name).ok().filter(|v| !v.is_empty()) {
                recorder::engine::config::user_conf(&env).map_err(|e| anyhow::anyhow!("{name}={env}: {e}"))?;
            }
        }
    }
    let lib = find_lib(opts.lib.as_deref())?;
    let run_dir = RunDir::create()?;
    let shim_dir = run_dir.0.join("python");
    shim::write_shim(&shim_dir).with_context(|| format!("cannot write the Python shim to {}", shim_dir.display()))?;
    let status_dir = run_dir.0.join("status");
    let history_dir = run_dir.0.join("history");

    let mut pythonpath = std::ffi::OsString::from(&shim_dir);
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        pythonpath.push(":");
        pythonpath.push(old);
    }
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("PYTHONPATH", pythonpath)
        .env("ALLOCTRACE_LIB", &lib)
        .env("ALLOCTRACE_OUTPUT", &output)
        .env("ALLOCTRACE_STATUS", &status_dir)
        .env("ALLOCTRACE_HISTORY_DIR", &history_dir)
        .env("ALLOCTRACE_ALLOCATOR", opts.allocator.env_value())
        .env("ALLOCTRACE_STACKS", if opts.stacks { "1" } else { "0" });
    if let Some(c) = &opts.conf {
        cmd.env("ALLOCTRACE_CONF", c);
        if opts.allocator == Allocator::Pytorch {
            // PyTorch's allocator runs the job: the settings are its own. Both variables, since
            // PyTorch reads most keys from PYTORCH_ALLOC_CONF when that is set.
            cmd.env("PYTORCH_CUDA_ALLOC_CONF", c).env("PYTORCH_ALLOC_CONF", c);
        }
    }
    if let Some(c) = &opts.capacity {
        cmd.env("ALLOCTRACE_CAPACITY", c);
    }
    cmd.env(
        "ALLOCTRACE_AFTER_LIMIT",
        match opts.after_limit {
            AfterLimit::Iterations(n) => n.to_string(),
            AfterLimit::End => "end".into(),
        },
    );
    let status = cmd.status().with_context(|| format!("cannot run {program}"))?;
    let code = exit_code(status);

    let mut statuses: Vec<String> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&status_dir) {
        let mut names: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        names.sort();
        statuses = names.iter().filter_map(|p| std::fs::read_to_string(p).ok()).collect();
    }
    for s in &statuses {
        let late = status_field(s, "late_capacity").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let path = status_field(s, "path").map(PathBuf::from).unwrap_or_else(|| output.clone());
        if late > 0 {
            if let Err(e) = set_capacity(&path, late) {
                eprintln!("alloctrace: cannot record the job's limit in {}: {e:#}", path.display());
            }
        }
    }
    let converted = match opts.convert_history {
        Some(convert) => convert(&history_dir, &output, opts.capacity.as_deref()),
        None if std::fs::read_dir(&history_dir).is_ok_and(|mut d| d.next().is_some()) => {
            vec!["alloctrace: PyTorch's allocator history was kept, but converting it needs the alloctrace CLI".into()]
        }
        None => Vec::new(),
    };
    drop(run_dir);
    if !opts.quiet {
        if statuses.is_empty() && converted.is_empty() {
            eprintln!("{}", summary(&output, None));
        }
        for s in &statuses {
            let path = status_field(s, "path").map(PathBuf::from).unwrap_or_else(|| output.clone());
            eprintln!("{}", summary(&path, Some(s)));
        }
        for line in &converted {
            eprintln!("{line}");
        }
    }
    Ok(code)
}

/// Puts `capacity` in the header of the trace at `path` (a limit the job set after its first
/// allocation, when the recorder had already written the header): the trace is copied with the
/// new header to a fresh file beside it, which then replaces it.
fn set_capacity(path: &Path, capacity: u64) -> Result<()> {
    use recorder::trace::TraceWriter;
    let mut r = TraceReader::open(path)?;
    let mut header = r.header().clone();
    if header.capacity_bytes == capacity {
        return Ok(());
    }
    header.capacity_bytes = capacity;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut write = || -> Result<()> {
        let mut w = TraceWriter::create(&tmp, &header)?;
        let mut chunk = Vec::new();
        while r.next_chunk(&mut chunk) {
            for rec in chunk.drain(..) {
                w.write_owned(rec)?;
            }
        }
        match r.end() {
            TraceEnd::Complete { trailer } => w.note_dropped(trailer.dropped_events),
            // Rewritten, it would read as complete: leave it as it is.
            other => bail!("the trace is not complete ({}): its header keeps no capacity", other.describe()),
        }
        w.finish()?;
        Ok(())
    };
    let done = write().and_then(|()| std::fs::rename(&tmp, path).map_err(anyhow::Error::from));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Refuses a trace path that cannot be written (a missing folder, no permission) before the
/// program starts: a job that runs for hours should not learn at its end that nothing was
/// recorded. An existing file is left as it is; the recorder replaces it when it starts.
/// The folder the private run folder goes in (`TMPDIR`) is one a hostile user cannot exploit:
/// absolute (a relative one records nothing once the job changes directory), without `:` (it
/// would split `PYTHONPATH`, where the shim's folder goes), and not writable by everyone unless
/// sticky (others could rename or replace what is in it).
fn check_temp_base(base: &Path) -> Result<()> {
    let shown = base.display();
    if !base.is_absolute() {
        bail!("refusing TMPDIR={shown}: a relative folder; set TMPDIR to an absolute one");
    }
    if base.to_string_lossy().contains(':') {
        bail!("refusing TMPDIR={shown}: it contains ':', which would split PYTHONPATH");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(base).with_context(|| format!("cannot use TMPDIR={shown}"))?;
        let mode = m.permissions().mode();
        if mode & 0o002 != 0 && mode & 0o1000 == 0 {
            bail!("refusing TMPDIR={shown}: writable by everyone without the sticky bit (mode {:o})", mode & 0o7777);
        }
    }
    Ok(())
}

/// Settings inherited from the environment are checked as the flags are, before the job runs.
fn check_inherited(opts: &RecordOptions) -> Result<()> {
    if opts.conf.is_none() {
        if let Some(c) = std::env::var("ALLOCTRACE_CONF").ok().filter(|v| !v.is_empty()) {
            recorder::engine::config::user_conf(&c).map_err(|e| anyhow::anyhow!("ALLOCTRACE_CONF={c}: {e}"))?;
        }
    }
    if opts.capacity.is_none() {
        if let Some(c) = std::env::var("ALLOCTRACE_CAPACITY").ok().filter(|v| !v.is_empty()) {
            match recorder::engine::config::parse_bytes(&c) {
                Ok(0) => bail!("ALLOCTRACE_CAPACITY={c}: a 0-byte limit fits nothing; unset it for no limit"),
                Ok(_) => {}
                Err(e) => bail!("ALLOCTRACE_CAPACITY={c}: {e}"),
            }
        }
    }
    Ok(())
}

fn check_writable(path: &Path) -> Result<()> {
    // The recorder opens the trace by name: never through a link planted there.
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!("refusing to write the trace {}: it is a symbolic link", path.display());
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("cannot write the trace {}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

#[cfg(unix)]
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(not(unix))]
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or(1)
}

/// `key=value` lines of the recorder's status file.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// The line printed after the run: what the trace holds, and what was lost.
pub fn summary(output: &Path, recorder_status: Option<&str>) -> String {
    let mut parts = Vec::new();
    match TraceReader::open(output) {
        Err(e) => parts.push(format!("alloctrace: no readable trace at {}: {e}", output.display())),
        Ok(mut r) => {
            let mut events = 0u64;
            while r.next().is_some() {
                events += 1;
            }
            let bytes = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
            parts.push(format!(
                "alloctrace: {} events in {} ({} bytes, {:.1} bytes/event), {}",
                events,
                output.display(),
                bytes,
                bytes as f64 / events.max(1) as f64,
                r.end().describe()
            ));
            if let TraceEnd::Complete { trailer } = r.end() {
                if trailer.dropped_events > 0 {
                    parts.push(format!("WARNING: {} events were dropped", trailer.dropped_events));
                }
            }
        }
    }
    match recorder_status {
        None => parts
            .push("the recorder did not report (the program did not use CUDA through PyTorch, or was killed)".into()),
        Some(s) => {
            let dropped: u64 = status_field(s, "events_dropped").and_then(|v| v.parse().ok()).unwrap_or(0);
            if dropped > 0 {
                parts.push(format!("WARNING: the recorder dropped {dropped} events"));
            }
            if let Some(e) = status_field(s, "error").filter(|e| !e.is_empty()) {
                parts.push(format!("WARNING: writing the trace failed: {e}"));
            }
            let free_errors: u64 = status_field(s, "free_errors").and_then(|v| v.parse().ok()).unwrap_or(0);
            if free_errors > 0 {
                parts.push(format!(
                    "WARNING: {free_errors} frees of pointers the allocator did not hand out (double frees or foreign \
                     pointers)"
                ));
            }
            if let Some(e) = status_field(s, "device_errors").filter(|e| !e.is_empty()) {
                parts.push(format!("WARNING: CUDA errors: {e}"));
            }
            let waited: u64 = status_field(s, "waited_ns").and_then(|v| v.parse().ok()).unwrap_or(0);
            if waited >= 1_000_000 {
                parts.push(format!(
                    "recording slowed the program: allocations waited {:.0} ms in all for the trace writer",
                    waited as f64 / 1e6
                ));
            }
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three shapes of TMPDIR a hostile environment sets, refused; a sticky shared folder
    /// (as /tmp is) and a private one accepted.
    #[cfg(unix)]
    #[test]
    fn a_hostile_tmpdir_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let err = |p: &Path| check_temp_base(p).unwrap_err().to_string();
        assert!(err(Path::new("relative/tmp")).contains("relative"));
        let d = tempfile::tempdir().unwrap();
        let colon = d.path().join("a:b");
        std::fs::create_dir(&colon).unwrap();
        assert!(err(&colon).contains("PYTHONPATH"));
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(err(&open).contains("sticky"), "{}", err(&open));
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_temp_base(&open).unwrap();
        check_temp_base(d.path()).unwrap();
    }

    /// `-o` at a symbolic link (dangling or not) is refused: the trace is never written through it.
    #[cfg(unix)]
    #[test]
    fn the_trace_is_never_written_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("run.atrace");
        std::os::unix::fs::symlink(d.path().join("elsewhere"), &link).unwrap();
        assert!(check_writable(&link).unwrap_err().to_string().contains("symbolic link"));
        assert!(!d.path().join("elsewhere").exists(), "the link's target was created");
    }

    /// An `alloctrace` that `pip install` put in a virtualenv's `bin/` finds the recorder library
    /// the same wheel put in the package, as it finds one beside it in a build.
    #[test]
    fn the_library_is_found_in_the_installed_python_package() {
        let venv = tempfile::tempdir().unwrap();
        let bin = venv.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        assert_eq!(lib_near(&bin), None);
        let pkg = venv.path().join("lib/python3.12/site-packages/alloctrace/lib");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("librecorder.so"), b"").unwrap();
        assert_eq!(lib_near(&bin), Some(pkg.join("librecorder.so").canonicalize().unwrap()));
        // One beside the executable (a build) comes first.
        std::fs::write(bin.join("librecorder.so"), b"").unwrap();
        assert_eq!(lib_near(&bin), Some(bin.join("librecorder.so").canonicalize().unwrap()));
    }

    /// The shim goes to a fresh folder of random name, mode 0700, made by this run and removed
    /// after it; a folder planted under the old predictable name (with a `json.py` that would
    /// run inside the job) is neither used nor touched.
    #[cfg(unix)]
    #[test]
    fn the_shim_folder_is_fresh_private_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let planted = std::env::temp_dir().join(format!("alloctrace-record-{}", std::process::id()));
        std::fs::create_dir_all(planted.join("python")).unwrap();
        std::fs::write(planted.join("python/json.py"), "raise SystemExit('planted code ran')\n").unwrap();

        let (a, b) = (RunDir::create().unwrap(), RunDir::create().unwrap());
        assert_ne!(a.0, b.0);
        for d in [&a, &b] {
            let m = std::fs::symlink_metadata(&d.0).unwrap();
            assert!(m.is_dir() && m.permissions().mode() & 0o777 == 0o700, "{:o}", m.permissions().mode());
        }
        // A file planted in the shim folder is never overwritten or followed.
        std::os::unix::fs::symlink(planted.join("python/json.py"), a.0.join("python/sitecustomize.py")).unwrap();
        assert!(shim::write_shim(&a.0.join("python")).is_err());
        assert!(std::fs::read_to_string(planted.join("python/json.py")).unwrap().contains("planted"));
        let path = a.0.clone();
        drop(a);
        assert!(!path.exists(), "removed afterwards");

        // A whole run: the program sees the fresh folder first on PYTHONPATH, and it is gone after.
        let out = std::env::temp_dir().join(format!("alloctrace-shimtest-{}.txt", std::process::id()));
        let opts = RecordOptions {
            output: out.with_extension("atrace"),
            lib: Some(PathBuf::from("/bin/sh")),
            command: vec!["sh".into(), "-c".into(), format!("echo \"$PYTHONPATH\" > {}", out.display())],
            quiet: true,
            ..Default::default()
        };
        assert_eq!(run(&opts).unwrap(), 0);
        let seen = std::fs::read_to_string(&out).unwrap();
        let first = PathBuf::from(seen.trim().split(':').next().unwrap());
        assert!(first.ends_with("python") && first.parent().unwrap() != planted, "{seen}");
        assert!(!first.exists(), "the run's folder is removed");
        assert!(planted.join("python/json.py").exists(), "the planted folder is left alone");
        let _ = std::fs::remove_dir_all(&planted);
        let _ = std::fs::remove_file(&out);
    }

    /// A limit the job set after the recorder wrote its header (reported as `late_capacity`)
    /// goes into the header; the events, and a trailer's dropped count, are kept as they were.
    /// A trace cut short is left alone: rewritten, it would read as complete.
    #[test]
    fn a_late_limit_goes_into_the_header() {
        use recorder::trace::{Event, Header, Record, Source, TraceWriter};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.atrace");
        let mut w = TraceWriter::create(&path, &Header::new(Source::Recorded)).unwrap();
        for i in 0..1000u64 {
            let event =
                Event::SegmentAlloc { addr: i << 21, bytes: 2 << 20, stream: 0, pool: recorder::trace::Pool::Small };
            w.write(&Record { time_ns: i, event }).unwrap();
        }
        w.note_dropped(2);
        w.finish().unwrap();
        let before = TraceReader::open(&path).unwrap().read_all();

        set_capacity(&path, 3 << 30).unwrap();
        let mut r = TraceReader::open(&path).unwrap();
        assert_eq!(r.header().capacity_bytes, 3 << 30);
        assert_eq!(r.read_all(), before);
        assert!(matches!(r.end(), TraceEnd::Complete { trailer } if trailer.dropped_events == 2));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no file left beside it");

        // Cut short (no trailer): refused, the file untouched.
        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.atrace");
        std::fs::write(&cut, &bytes[..bytes.len() - 8]).unwrap();
        let err = set_capacity(&cut, 1 << 30).unwrap_err();
        assert!(format!("{err:#}").contains("not complete"), "{err:#}");
        assert_eq!(std::fs::read(&cut).unwrap(), &bytes[..bytes.len() - 8]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    /// The closing line reports what the recorder's status file says went wrong, and how long
    /// the program waited for the writer (only when it matters: from a millisecond).
    #[test]
    fn summary_reports_losses_and_waits() {
        let missing = Path::new("/nonexistent/alloctrace/run.atrace");
        let status =
            "path=x\nevents=10\nevents_dropped=3\nerror=disk full\ndevice_errors=\nwaited_ns=12500000\nfree_errors=2\n";
        let line = summary(missing, Some(status));
        assert!(line.starts_with("alloctrace: no readable trace at /nonexistent/alloctrace/run.atrace"), "{line}");
        assert!(line.contains("WARNING: the recorder dropped 3 events"), "{line}");
        assert!(line.contains("WARNING: writing the trace failed: disk full"), "{line}");
        assert!(line.contains("allocations waited 12 ms in all"), "{line}");
        assert!(line.contains("WARNING: 2 frees of pointers the allocator did not hand out"), "{line}");
        assert!(!summary(missing, Some("waited_ns=999999\n")).contains("waited"));
        assert!(summary(missing, None).contains("the recorder did not report"));
    }
}
