//! Prints the fidelity table: every truth.tsv row replayed through the engine, predicted vs
//! real outcome and peaks. `cargo run --release -p alloctrace-recorder --example fidelity`

#[path = "../tests/support/replay.rs"]
mod replay;

fn main() {
    let rows = replay::truth();
    let (mut agree, mut n) = (0, 0);
    println!("workload\tpolicy\tlevel\tlimit\treal\tpred\treal_peak_res\tpred_peak_res\tres_err%\treal_peak_alloc\tpred_peak_alloc\tretries(real/pred)\tseg_seq");
    for row in &rows {
        let name = replay::fixture_for(row);
        let t = replay::load(&name);
        let o = replay::replay(&t, replay::policy_conf(&row.policy), replay::capacity_of(row));
        let seg_match = if row.level == "unlimited" && name.ends_with(&row.policy) {
            if o.segment_events == replay::recorded_segment_events(&t) {
                "same"
            } else {
                "DIFF"
            }
        } else {
            "-"
        };
        n += 1;
        if o.oom == row.oom {
            agree += 1;
        }
        let err = 100.0 * (o.peak_reserved as f64 - row.peak_reserved as f64) / row.peak_reserved as f64;
        let oc = |b: bool| if b { "oom" } else { "ok" };
        println!(
            "{}\t{}\t{}\t{:?}\t{}\t{}\t{}\t{}\t{:+.2}\t{}\t{}\t{}/{}\t{}",
            row.workload,
            row.policy,
            row.level,
            row.limit_gib,
            oc(row.oom),
            oc(o.oom),
            row.peak_reserved,
            o.peak_reserved,
            err,
            row.peak_allocated,
            o.peak_allocated,
            row.num_alloc_retries,
            o.num_alloc_retries,
            seg_match
        );
    }
    println!("outcome agreement: {agree}/{n}");
}
