//! Replays of real PyTorch 2.11 traces (compact fixtures made from the snapshots in
//! `traces/torch/`) must reproduce what PyTorch reported in truth.tsv.

mod support {
    pub mod replay;
}
use support::replay;

#[test]
fn own_settings_reproduce_peaks_and_segment_sequence() {
    for row in replay::truth() {
        let name = replay::fixture_for(&row);
        if row.level != "unlimited" || !name.ends_with(&row.policy) {
            continue;
        }
        let t = replay::load(&name);
        let o = replay::replay(&t, &t.conf, replay::capacity_of(&row));
        assert_eq!(o.peak_reserved, row.peak_reserved, "{name}: peak_reserved");
        assert_eq!(o.peak_allocated, row.peak_allocated, "{name}: peak_allocated");
        assert_eq!(o.oom, row.oom, "{name}: outcome");
        assert_eq!(o.num_alloc_retries, row.num_alloc_retries, "{name}: retries");
        assert_eq!(o.segment_events, replay::recorded_segment_events(&t), "{name}: segment sequence");
        assert_eq!(o.address_mismatches, 0, "{name}: every block at its recorded address");
        assert_eq!(o.free_errors, 0, "{name}");
    }
}

#[test]
fn policy_and_limit_rows_predict_outcome_and_peak() {
    let rows = replay::truth();
    let mut agree = 0;
    for row in &rows {
        let t = replay::load(&replay::fixture_for(row));
        let o = replay::replay(&t, replay::policy_conf(&row.policy), replay::capacity_of(row));
        agree += (o.oom == row.oom) as usize;
        if row.level == "unlimited" {
            let err = (o.peak_reserved as f64 - row.peak_reserved as f64).abs() / row.peak_reserved as f64;
            assert!(err <= 0.02, "{row:?}: predicted peak_reserved {}", o.peak_reserved);
        }
    }
    assert!(agree * 100 >= rows.len() * 95, "outcome agreement {agree}/{}", rows.len());
}
