//! The recording shim's phase marks (forward at the outermost module, backward, optimizer
//! steps), its run past the memory limit and its call-site resolver thread, run by Python on a
//! stand-in for torch (`shim/phases.py`, `shim/past_limit.py`, `shim/sites.py`). Skipped, saying
//! so, where there is no `python3`.

use std::path::Path;
use std::process::Command;

#[test]
fn the_shim_marks_forward_backward_and_optimizer_steps() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = match Command::new("python3")
        .arg(here.join("tests/shim/phases.py"))
        .env("PYTHONPATH", here.join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no python3 ({e})");
            return;
        }
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("PASS"), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
}

/// Past the limit (default back-end): the job's memory fraction is recorded as the capacity and
/// not applied, and the job stops its N whole iterations after it went past it, with one line
/// (`shim/past_limit.py`, on a stand-in for torch).
#[test]
fn the_shim_lifts_the_limit_and_stops_past_it() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = match Command::new("python3")
        .arg(here.join("tests/shim/past_limit.py"))
        .env("PYTHONPATH", here.join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no python3 ({e})");
            return;
        }
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("PASS"), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
}

/// `--stacks` with PyTorch's allocator: the resolver thread resolves stacks as they come, and at
/// the end is stopped and what is left resolved before the traces close; a forked child's copy
/// does nothing (`shim/sites.py`, on a stand-in for the helper).
#[test]
fn the_shim_resolves_call_sites_on_its_thread_and_at_the_end() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = match Command::new("python3")
        .arg(here.join("tests/shim/sites.py"))
        .env("PYTHONPATH", here.join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no python3 ({e})");
            return;
        }
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("PASS"), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
}
