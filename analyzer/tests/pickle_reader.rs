//! The pickle reader against pickles written by CPython (`fixtures/values.p{2,3,4,5}.pickle`,
//! made by `pickle.dumps(obj, protocol=N)` of the object in `check_values`), and never
//! panicking on damaged input.

use analyzer::source::import::pickle::{self, Pickle, Value};
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/").to_string() + name).unwrap()
}

/// obj = {'a': [1, -1, 255, 256, 65535, 65536, -2**31, 2**31-1, 2**63-1, -2**63, 2**64+5, -(2**70)],
///        'b': (1.5, 'héllo', b'by', None, True, False), 'c': (),
///        'd': [shared, shared, (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],   # shared = [{'filename': 'x.py', 'line': 3, 'name': 'f'}]
///        'e': 'x' * 300, 'f': b'y' * 300}
fn check_values(pk: &Pickle<'_>, protocol: u8) {
    let root = pk.root;
    let a = pk.seq(pk.get(root, "a").unwrap()).unwrap();
    let ints: Vec<i128> = a.iter().map(|&v| pk.int(v).unwrap()).collect();
    assert_eq!(
        ints,
        vec![
            1,
            -1,
            255,
            256,
            65535,
            65536,
            -(1 << 31),
            (1 << 31) - 1,
            i64::MAX as i128,
            i64::MIN as i128,
            (1i128 << 64) + 5,
            -(1i128 << 70)
        ]
    );
    let b = pk.seq(pk.get(root, "b").unwrap()).unwrap();
    assert!(matches!(pk.get(root, "b"), Some(Value::Tuple(_))));
    assert_eq!(b[0], Value::Float(1.5));
    assert_eq!(pk.str(b[1]), Some("héllo"));
    if protocol >= 3 {
        assert_eq!(b[2], Value::Bytes(b"by"));
    } else {
        // Protocol 2 has no bytes type: CPython writes `_codecs.encode('by', 'latin1')`, which
        // stays an opaque object.
        assert!(matches!(b[2], Value::Object(_)), "{:?}", b[2]);
    }
    assert_eq!(&b[3..], &[Value::None, Value::Bool(true), Value::Bool(false)]);
    assert_eq!(pk.seq(pk.get(root, "c").unwrap()), Some(&[][..]));
    let d = pk.seq(pk.get(root, "d").unwrap()).unwrap();
    // The shared list is one container, referenced twice through the memo.
    assert_eq!(d[0], d[1]);
    assert_eq!(d[0].container_id(), d[1].container_id());
    let frame = pk.seq(d[0]).unwrap()[0];
    assert_eq!(pk.str(pk.get(frame, "filename").unwrap()), Some("x.py"));
    assert_eq!(pk.get(frame, "line"), Some(Value::Int(3)));
    for (n, t) in d[2..].iter().enumerate() {
        let items = pk.seq(*t).unwrap();
        assert!(matches!(t, Value::Tuple(_)));
        assert_eq!(items.len(), n + 1);
    }
    assert_eq!(pk.str(pk.get(root, "e").unwrap()).map(str::len), Some(300));
    if protocol >= 3 {
        assert_eq!(pk.get(root, "f"), Some(Value::Bytes(&[b'y'; 300])));
    }
    assert_eq!(pk.protocol, protocol);
}

#[test]
fn cpython_pickles_of_protocols_2_to_5() {
    for protocol in 2..=5u8 {
        let bytes = fixture(&format!("values.p{protocol}.pickle"));
        let pk = pickle::parse(&bytes).unwrap_or_else(|e| panic!("protocol {protocol}: {e}"));
        check_values(&pk, protocol);
    }
}

#[test]
fn every_truncation_of_a_real_pickle_is_an_error_naming_an_offset() {
    let bytes = fixture("values.p4.pickle");
    for n in 0..bytes.len() {
        let e = pickle::parse(&bytes[..n]).unwrap_err();
        assert!(e.offset() <= n, "cut at {n}: {e}");
        assert!(e.to_string().contains(&format!("at byte {}", e.offset())), "{e}");
    }
}

fn snapshot_bytes() -> Vec<u8> {
    fixture("torch/seed_experiments.default.pickle")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = pickle::parse(&data);
        let _ = analyzer::source::import::import_snapshot(&data, &Default::default());
    }

    #[test]
    fn random_opcode_soup_never_panics(data in proptest::collection::vec(
        prop_oneof![Just(0x80u8), Just(b'('), Just(b']'), Just(b'}'), Just(b'e'), Just(b'u'), Just(b'a'),
                    Just(b's'), Just(b'h'), Just(0x94), Just(b'K'), Just(b'q'), Just(b'R'), Just(b'b'),
                    Just(0x85), Just(0x87), Just(b't'), Just(b'0'), Just(b'1'), Just(b'2'), Just(b'.'),
                    Just(0x93), Just(0x81), Just(b'N'), any::<u8>()], 0..256)) {
        let _ = pickle::parse(&data);
    }

    #[test]
    fn damaged_snapshots_never_panic(cut in 0usize..1887, flips in proptest::collection::vec((0usize..1887, any::<u8>()), 0..8)) {
        let mut bytes = snapshot_bytes();
        for (at, x) in flips {
            if at < bytes.len() {
                bytes[at] ^= x;
            }
        }
        // Flips alone, then flips and a truncation.
        let _ = analyzer::source::import::import_snapshot(&bytes, &Default::default());
        bytes.truncate(cut.min(bytes.len()));
        let _ = analyzer::source::import::import_snapshot(&bytes, &Default::default());
    }
}
