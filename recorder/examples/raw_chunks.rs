//! Writes the first thousand records of each trace given on the command line again, with
//! uncompressed chunk bodies, into the directory given first: seeds for the `trace_records`
//! fuzz target (whose mutations should hit records, not zstd streams).
//! Usage: cargo run -p alloctrace-recorder --example raw_chunks -- OUT_DIR TRACE...
use recorder::trace::{TraceReader, TraceWriter};

fn main() {
    let mut args = std::env::args_os().skip(1);
    let out = std::path::PathBuf::from(args.next().expect("usage: raw_chunks OUT_DIR TRACE..."));
    std::fs::create_dir_all(&out).expect("create the output directory");
    for path in args {
        let path = std::path::PathBuf::from(path);
        let Ok(mut r) = TraceReader::open(&path) else { continue };
        let Ok(mut w) = TraceWriter::new(Vec::new(), r.header()) else { continue };
        w.set_compression(false);
        // A small seed mutates faster: the first thousand records are plenty.
        for rec in (&mut r).take(1000) {
            w.write_owned(rec).expect("writing to memory");
        }
        let bytes = w.finish().expect("writing to memory");
        let name = path.file_name().expect("a file name");
        std::fs::write(out.join(name), bytes).expect("write a seed");
    }
}
