//! The Python shim that installs the recorder into unmodified PyTorch programs: a
//! `sitecustomize.py` (run at interpreter start when its folder is on `PYTHONPATH`) and the
//! `alloctrace_hook` module it calls. Sources live in `recorder/python/`; they are compiled in so
//! that `alloctrace record` is one binary plus the cdylib.

use std::path::Path;

/// `recorder/python/sitecustomize.py`.
pub const SITECUSTOMIZE_PY: &str = include_str!("../../python/sitecustomize.py");
/// `recorder/python/alloctrace_hook.py`.
pub const HOOK_PY: &str = include_str!("../../python/alloctrace_hook.py");

/// `recorder/python/alloctrace_torch_helper.cpp`: the default back-end's PyTorch extension.
pub const HELPER_CPP: &str = include_str!("../../python/alloctrace_torch_helper.cpp");

/// Writes the shim's files into `dir` (an existing folder, which then goes first on
/// `PYTHONPATH`). Each file is created new (mode 0600): an existing file or a link planted in
/// the folder is an error, never overwritten or followed.
pub fn write_shim(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    for (name, text) in [
        ("sitecustomize.py", SITECUSTOMIZE_PY),
        ("alloctrace_hook.py", HOOK_PY),
        ("alloctrace_torch_helper.cpp", HELPER_CPP),
    ] {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        o.open(dir.join(name))?.write_all(text.as_bytes())?;
    }
    Ok(())
}
