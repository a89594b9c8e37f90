//! Streams are named `stream 0 (default)`, `stream 1`, ... in the text, the pictures and the
//! report, with the raw handles only in a note beside the names.

mod pictures_gen;

use pictures_gen::*;
use std::process::Command;

fn alloctrace(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(args).output().expect("run alloctrace");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn streams_have_one_name_in_text_svg_and_markdown() {
    let dir = temp_dir("streams");
    let trace = dir.join("s3.atrace");
    let t = trace.to_str().unwrap();
    // Three streams: the default and two loaders (handles 0x1001 and 0x1002 = 4097 and 4098).
    alloctrace(&["synth", "--events", "20000", "--streams", "3", "-o", t]);
    let note = "stream 1 = handle 0x1001, stream 2 = handle 0x1002";

    // Words, whitespace collapsed: the text wraps at 100 columns.
    let frag = alloctrace(&["frag", t, "--at", "peak"]).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        frag.contains(" stream 0 (default)") && frag.contains(" stream 1:") && frag.contains(" stream 2:"),
        "{frag}"
    );
    assert!(frag.contains(note), "{frag}");

    let svg_path = dir.join("seg.svg");
    alloctrace(&["plot", t, "--kind", "segments", "--at", "peak", "-o", svg_path.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&svg_path).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    // Rows name their stream: every labelled row (up to 40 of them, in address order) says
    // which, in the same words as the text.
    assert!(svg.contains(", stream 0 (default) <"), "segment rows name streams");
    assert!(!svg.contains(" small <") && !svg.contains(" large <"), "a segment row without its stream");
    assert!(svg.contains(note), "the legend gives the handles");

    let report = dir.join("report");
    alloctrace(&["report", t, "-o", report.to_str().unwrap(), "--no-search"]);
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.replace('\n', " ").contains(note), "the report gives the handles beside the segment map");

    // The raw handles appear only in the notes.
    for text in [&frag, &svg, &md] {
        let without_note = text.replace(note, "");
        for raw in ["4097", "4098", "0x1001", "0x1002"] {
            assert!(!without_note.contains(&format!("stream {raw}")), "a raw handle named as a stream: {raw}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
