//! `alloctrace diff` on a constructed pair of traces whose deltas are known.

mod pictures_gen;

use analyzer::analysis::diff::diff;
use pictures_gen::*;

const MIB: u64 = 1 << 20;

#[test]
fn deltas_of_a_constructed_pair() {
    let dir = temp_dir("diff");
    // A: f() holds 2 x 1 MiB and g() 4 MiB at the peak (6 MiB).
    let mut a = Builder::default();
    a.callsite(1, "a.py", 1, "f");
    a.callsite(2, "b.py", 2, "g");
    let blocks = [a.alloc(MIB, 1), a.alloc(MIB, 1), a.alloc(4 * MIB, 2)];
    for b in blocks {
        a.free(b);
    }
    // B: the same f() under another call-site id, now 3 x 1 MiB; g() gone; h() 2 MiB. Peak 5 MiB.
    let mut b = Builder::default();
    b.callsite(7, "a.py", 1, "f");
    b.callsite(8, "c.py", 3, "h");
    let blocks = [b.alloc(MIB, 7), b.alloc(MIB, 7), b.alloc(MIB, 7), b.alloc(2 * MIB, 8)];
    for x in blocks {
        b.free(x);
    }
    let (pa, pb) = (dir.join("a.atrace"), dir.join("b.atrace"));
    a.write(&pa);
    b.write(&pb);
    let d =
        diff(&analyzer::model::Trace::open(&pa).unwrap(), &analyzer::model::Trace::open(&pb).unwrap()).expect("diff");
    assert_eq!(d.a.peak_requested_bytes, 6 * MIB);
    assert_eq!(d.b.peak_requested_bytes, 5 * MIB);
    assert_eq!(d.deltas.peak_requested_bytes, -(MIB as i64));
    assert_eq!(d.deltas.allocations, 1);
    assert_eq!(d.deltas.recorded_ooms, 0);
    let rows: Vec<(&str, i64, i64)> =
        d.callsites.iter().map(|c| (c.callsite.label.as_str(), c.delta_bytes_at_peak, c.delta_allocations)).collect();
    assert_eq!(
        rows,
        vec![("b.py:2 (g)", -4 * MIB as i64, -1), ("c.py:3 (h)", 2 * MIB as i64, 1), ("a.py:1 (f)", MIB as i64, 1)],
        "matched by frames, largest change first"
    );
    let f = &d.callsites[2];
    assert_eq!((f.a_bytes_at_peak, f.b_bytes_at_peak, f.a_allocations, f.b_allocations), (2 * MIB, 3 * MIB, 2, 3));
    // The replay agrees with the recorded peaks (1 MiB requests round to 1 MiB blocks).
    assert_eq!(d.a.replayed_peak_allocated_bytes, 6 * MIB);
    assert_eq!(d.b.replayed_peak_allocated_bytes, 5 * MIB);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_trace_against_itself_has_no_deltas() {
    let p = shipped("gpt2_train.default.atrace");
    let d = diff(&analyzer::model::Trace::open(&p).unwrap(), &analyzer::model::Trace::open(&p).unwrap()).expect("diff");
    assert_eq!(d.deltas.replayed_peak_reserved_bytes, 0);
    assert!(d.callsites.iter().all(|c| c.delta_bytes_at_peak == 0 && c.delta_allocations == 0));
    assert!(d.callsites.len() > 5 && d.a.has_callsites);
}

#[test]
fn overlay_names_both_runs() {
    use analyzer::analysis::picture::{timeline_data, XAxis, COLUMNS};
    use analyzer::render::plot::render_overlay;
    let a = timeline_data(
        &analyzer::model::Trace::open(&shipped("frag_oom.default.atrace")).unwrap(),
        XAxis::Time,
        COLUMNS,
    )
    .unwrap();
    let b = timeline_data(
        &analyzer::model::Trace::open(&shipped("frag_oom.expandable.atrace")).unwrap(),
        XAxis::Time,
        COLUMNS,
    )
    .unwrap();
    let svg = render_overlay(&a, &b).unwrap();
    check_well_formed(&svg);
    for needle in [
        "A: frag_oom.default.atrace",
        "B: frag_oom.expandable.atrace",
        "A reserved",
        "B allocated",
        "A OOM (1.00 GiB)",
        "B OOM (1.00 GiB)",
    ] {
        assert!(svg.contains(needle), "no {needle:?}");
    }
}
