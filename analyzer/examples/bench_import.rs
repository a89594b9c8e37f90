//! Speed of the snapshot import against CPython's `pickle.load` of the same files.
//!
//! ```text
//! cargo run --release -p alloctrace --example bench_import [-- N [FILE...]]
//! ```
//! Imports each snapshot N times (default 50) from memory, prints trace entries per second
//! (the file read is timed separately; `parse ms` is the pickle parse alone, part of the import), then times `pickle.load` of the same file N times in a
//! `python3` subprocess (interpreter start-up excluded) and prints the ratio.

use analyzer::source::import::{import_snapshot, ImportOptions};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let mut files: Vec<PathBuf> = args.map(PathBuf::from).collect();
    if files.is_empty() {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch"));
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("fixtures directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
            .collect();
        found.sort();
        files = found;
    }
    println!(
        "{:<34} {:>9} {:>8} {:>9} {:>10} {:>12} {:>10} {:>10} {:>7}",
        "file", "bytes", "entries", "parse ms", "import ms", "entries/s", "MB/s", "python ms", "ratio"
    );
    let (mut tot_entries, mut tot_rust, mut tot_py) = (0u64, 0f64, 0f64);
    for path in &files {
        let t = Instant::now();
        let bytes = std::fs::read(path).expect("readable snapshot");
        let read_s = t.elapsed().as_secs_f64();
        let opts = ImportOptions::default();
        let warm = import_snapshot(&bytes, &opts).expect("importable snapshot");
        let entries = warm.report.entries;
        let t = Instant::now();
        for _ in 0..n {
            let im = import_snapshot(&bytes, &opts).expect("importable snapshot");
            std::hint::black_box(&im.records);
        }
        let rust_s = t.elapsed().as_secs_f64() / n as f64;
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(analyzer::source::import::pickle::parse(&bytes).expect("parsable").container_count());
        }
        let parse_s = t.elapsed().as_secs_f64() / n as f64;
        let py_s = python_load_seconds(path, n);
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let py = py_s.map(|s| format!("{:.2}", s * 1e3)).unwrap_or_else(|| "n/a".into());
        let ratio = py_s.map(|s| format!("{:.1}x", s / rust_s)).unwrap_or_else(|| "n/a".into());
        println!(
            "{:<34} {:>9} {:>8} {:>9.3} {:>10.3} {:>12.0} {:>10.1} {:>10} {:>7}",
            name,
            bytes.len(),
            entries,
            parse_s * 1e3,
            rust_s * 1e3,
            entries as f64 / rust_s,
            bytes.len() as f64 / rust_s / 1e6,
            py,
            ratio
        );
        if read_s > rust_s {
            println!("  (reading the file took {:.3} ms)", read_s * 1e3);
        }
        tot_entries += entries;
        tot_rust += rust_s;
        tot_py += py_s.unwrap_or(f64::NAN);
    }
    println!(
        "all: {tot_entries} entries in {:.3} ms = {:.0} entries/s; python pickle.load {:.3} ms; ratio {:.1}x",
        tot_rust * 1e3,
        tot_entries as f64 / tot_rust,
        tot_py * 1e3,
        tot_py / tot_rust
    );
}

/// Mean seconds of `pickle.load` over `n` runs in one python3 process; `None` without python3.
fn python_load_seconds(path: &std::path::Path, n: u32) -> Option<f64> {
    let script = "import pickle, sys, time\n\
                  path, n = sys.argv[1], int(sys.argv[2])\n\
                  data = open(path, 'rb').read()\n\
                  pickle.loads(data)\n\
                  t = time.perf_counter()\n\
                  for _ in range(n):\n    pickle.loads(data)\n\
                  print((time.perf_counter() - t) / n)\n";
    let out = Command::new("python3").arg("-c").arg(script).arg(path).arg(n.to_string()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}
