//! The Python shim that installs the recorder into unmodified PyTorch programs: a
//! `sitecustomize.py` (run at interpreter start when its folder is on `PYTHONPATH`) and the
//! `alloctrace_hook` module it calls. Sources live in `recorder/python/`; they are compiled in so
//! that `alloctrace record` is one binary plus the cdylib.

use std::path::Path;

/// `recorder/python/sitecustomize.py`.
pub const SITECUSTOMIZE_PY: &str = include_str!("../../python/sitecustomize.py");
/// `recorder/python/alloctrace_hook.py`.
pub const HOOK_PY: &str = include_str!("../../python/alloctrace_hook.py");

/// Writes the shim's files into `dir` (which then goes first on `PYTHONPATH`).
pub fn write_shim(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("sitecustomize.py"), SITECUSTOMIZE_PY)?;
    std::fs::write(dir.join("alloctrace_hook.py"), HOOK_PY)?;
    Ok(())
}
