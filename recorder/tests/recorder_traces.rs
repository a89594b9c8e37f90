//! The traces recorded on an H100 (`traces/recorded_*.atrace`) read completely and replay to
//! exactly their recorded segment events on the simulated device.

use recorder::recorder::replay;

#[test]
fn recorded_traces_replay_exactly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("recorded_") && name.ends_with(".atrace")) {
            continue;
        }
        let c = replay::check_segments(&path).unwrap();
        assert!(!c.end.is_partial(), "{name}: {}", c.end.describe());
        assert!(c.same(), "{name}: first difference at {:?}", c.first_difference());
        assert_eq!(c.replay_free_errors, 0, "{name}");
        n += 1;
    }
    assert!(n >= 2, "expected the recorded traces in {}", dir.display());
}
