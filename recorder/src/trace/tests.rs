use super::*;
use proptest::prelude::*;

fn header() -> Header {
    let mut h = Header::new(Source::Simulated);
    h.tool_version = "0.0.0-test".into();
    h.device_name = "Sim".into();
    h.device_total_bytes = 80 << 30;
    h.alloc_conf = "expandable_segments:True".into();
    h.config = crate::engine::config::AllocatorConfig::parse(&h.alloc_conf).unwrap();
    h.pid = 42;
    h
}

fn sample() -> Vec<Record> {
    let ev = vec![
        Event::CallSite { id: 1, frames: vec![Frame { file: "train.py".into(), line: 7, function: "step".into() }] },
        Event::SegmentAlloc { addr: 0x7f00_0000_0000, bytes: 20 << 20, stream: 0, pool: Pool::Large },
        Event::Split { addr: 0x7f00_0000_0000, bytes: 4 << 20, remainder_bytes: 16 << 20 },
        Event::Alloc {
            id: 1,
            addr: 0x7f00_0000_0000,
            requested_bytes: 4_000_000,
            block_bytes: 4 << 20,
            stream: 0,
            pool: Pool::Large,
            callsite: 1,
        },
        Event::Mark { kind: MarkKind::Iteration, text: "step 1".into() },
        Event::FreeRequested { id: 1, addr: 0x7f00_0000_0000, callsite: 1 },
        Event::FreeCompleted { id: 1, addr: 0x7f00_0000_0000 },
        Event::Merge { addr: 0x7f00_0000_0000, absorbed_addr: 0x7f00_0040_0000, bytes: 20 << 20 },
        Event::SegmentFree { addr: 0x7f00_0000_0000, bytes: 20 << 20, stream: 0, pool: Pool::Large },
        Event::CacheRelease { cause: ReleaseCause::EmptyCache, bytes: 20 << 20, segments: 1 },
        Event::SegmentMap { addr: 0x7e00_0000_0000, bytes: 2 << 20, stream: 7, pool: Pool::Small },
        Event::SegmentUnmap { addr: 0x7e00_0000_0000, bytes: 2 << 20, stream: 7, pool: Pool::Small },
        Event::Oom {
            requested_bytes: 1 << 30,
            alloc_bytes: 1 << 30,
            device_free_bytes: 5,
            reserved_bytes: 6,
            allocated_bytes: 7,
            limit_bytes: 2 << 30,
            stream: 0,
        },
        Event::Snapshot { active_bytes: 9 },
        Event::DeviceMemInfo { free_bytes: 1, total_bytes: 2 },
        Event::Dropped { events: 3 },
    ];
    ev.into_iter().enumerate().map(|(i, event)| Record { time_ns: 1000 + 250 * i as u64, event }).collect()
}

fn write(records: &[Record], compress: bool) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    w.set_compression(compress);
    for r in records {
        w.write(r).unwrap();
    }
    w.finish().unwrap()
}

fn read(bytes: &[u8]) -> Result<(Vec<Record>, TraceEnd), TraceError> {
    let mut r = TraceReader::new(bytes)?;
    let recs = r.read_all();
    Ok((recs, r.end().clone()))
}

#[test]
fn round_trip_every_event_kind() {
    // The golden sample predates `segment_pool`: it follows here, so that the golden bytes stay
    // those of the first traces.
    let mut recs = sample();
    let t = recs.last().map_or(0, |r| r.time_ns) + 250;
    recs.push(Record { time_ns: t, event: Event::SegmentPool { addr: 0x7f00_0000_0000, pool_id: [1, 0] } });
    let kinds: std::collections::HashSet<_> = recs.iter().map(|r| r.event.kind_index()).collect();
    assert_eq!(kinds.len(), NUM_EVENT_KINDS, "the sample must cover every event kind");
    for compress in [false, true] {
        let bytes = write(&recs, compress);
        let mut r = TraceReader::new(&bytes[..]).unwrap();
        assert_eq!(r.header(), &header());
        let got = r.read_all();
        assert_eq!(got, recs);
        assert_eq!(
            r.end(),
            &TraceEnd::Complete { trailer: Trailer { events: recs.len() as u64, chunks: 1, dropped_events: 0 } }
        );
    }
}

/// Pins the encoding: if this changes, old traces no longer read. Bump FORMAT_VERSION instead.
#[test]
fn golden_bytes_are_stable() {
    let bytes = write(&sample(), false);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let golden = include_str!("golden_v1.hex").trim();
    if std::env::var_os("ALLOCTRACE_BLESS").is_some() {
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/src/trace/golden_v1.hex"), format!("{hex}\n")).unwrap();
        return;
    }
    assert_eq!(hex, golden, "trace encoding changed; re-bless with ALLOCTRACE_BLESS=1 only with a version bump");
}

#[test]
fn refuses_foreign_files_and_newer_versions() {
    let e = TraceReader::new(&b"PK\x03\x04 a zip file, not a trace"[..]).err().unwrap();
    assert!(matches!(e, TraceError::NotATrace { .. }), "{e}");
    assert!(e.to_string().contains("not an alloctrace trace"));
    let e = TraceReader::new(&b""[..]).err().unwrap();
    assert!(matches!(e, TraceError::NotATrace { .. }));
    assert!(e.to_string().contains("the file is empty (byte 0)"), "{e}");
    // A PyTorch snapshot given where a trace belongs: say how to import it.
    let e = TraceReader::new(&b"\x80\x04\x95\x10\x00\x00"[..]).err().unwrap();
    assert!(e.to_string().contains("Python pickle (protocol 4)") && e.to_string().contains("alloctrace import torch"));
    let e = TraceReader::new(&MAGIC[..5]).err().unwrap();
    assert!(e.to_string().contains("ends at byte 5 inside the 8-byte magic"), "{e}");

    let mut bytes = write(&sample(), true);
    bytes[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let e = TraceReader::new(&bytes[..]).err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, TraceError::NewerVersion { found: 2, supported: 1 }), "{msg}");
    assert!(msg.contains("version 2") && msg.contains("version 1"), "{msg}");
}

#[test]
fn cut_at_every_byte_reads_up_to_the_damage() {
    // Three chunks (flushed every 100 events), so that cuts after the first still yield events.
    let recs: Vec<Record> =
        (0..300u64).map(|i| Record { time_ns: i * 7, event: Event::Snapshot { active_bytes: i << 20 } }).collect();
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    for (i, r) in recs.iter().enumerate() {
        w.write(r).unwrap();
        if i % 100 == 99 {
            w.flush().unwrap();
        }
    }
    let full = w.finish().unwrap();
    let mut previous_events = 0;
    for cut in 0..full.len() {
        match read(&full[..cut]) {
            Err(e) => assert!(e.offset().is_some(), "cut {cut}: {e}"),
            Ok((got, end)) => {
                assert!(end.is_partial(), "cut {cut}: {end:?}");
                assert_eq!(&recs[..got.len()], &got[..], "cut {cut}");
                assert!(got.len() >= previous_events);
                previous_events = got.len();
            }
        }
    }
    assert_eq!(previous_events, 300, "a cut inside the trailer keeps every chunk");
    let (got, end) = read(&full).unwrap();
    assert_eq!(got.len(), recs.len());
    assert!(!end.is_partial());
}

#[test]
fn a_flipped_byte_is_reported_with_its_frame_offset() {
    let bytes = write(&sample(), true);
    let mut found_corrupt = 0;
    for i in PREAMBLE_BYTES as usize..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x40;
        match read(&b) {
            Err(e) => assert!(e.offset().is_some(), "byte {i}: {e}"),
            Ok((_, end)) => {
                assert!(end.is_partial(), "flip at {i} went unnoticed");
                if let TraceEnd::Corrupt { offset, .. } = end {
                    assert!(offset <= i as u64);
                    found_corrupt += 1;
                }
            }
        }
    }
    assert!(found_corrupt > 0);
}

#[test]
fn hostile_lengths_do_not_allocate() {
    let mut bytes = write(&sample(), true);
    // Frame length of the first chunk frame set to 4 GiB - 1.
    let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let chunk_at = 12 + 9 + header_len;
    bytes[chunk_at..chunk_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let (got, end) = read(&bytes).unwrap();
    assert!(got.is_empty());
    assert!(matches!(end, TraceEnd::Corrupt { offset, .. } if offset == chunk_at as u64), "{end:?}");
}

#[test]
fn truncated_trace_keeps_flushed_chunks() {
    let recs = sample();
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    for r in &recs[..5] {
        w.write(r).unwrap();
    }
    w.flush().unwrap();
    for r in &recs[5..] {
        w.write(r).unwrap();
    }
    // Simulates kill -9: the writer is never finished; only flushed frames exist.
    let flushed = w.bytes_written() as usize;
    let bytes = w.out.clone().unwrap();
    let (got, end) = read(&bytes[..flushed]).unwrap();
    assert_eq!(got, recs[..5]);
    assert!(matches!(end, TraceEnd::Truncated { .. }), "{end:?}");
}

/// With chunks compressed on a thread of their own the file is byte for byte the one written
/// inline, across many chunks and flushes, and `bytes_written` counts what a flush put out.
#[test]
fn background_compression_writes_the_same_bytes() {
    let recs: Vec<Record> = (0..5).flat_map(|_| sample()).collect();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (mut inline, mut bg) = (
        TraceWriter::new(Vec::new(), &header()).unwrap(),
        TraceWriter::new(Shared(shared.clone()), &header()).unwrap(),
    );
    bg.compress_in_background().unwrap();
    for (i, r) in recs.iter().enumerate() {
        inline.write(r).unwrap();
        bg.write(r).unwrap();
        if i % 7 == 0 {
            inline.flush().unwrap();
            bg.flush().unwrap();
            assert_eq!(bg.bytes_written(), inline.bytes_written());
            assert_eq!(shared.lock().unwrap().len() as u64, bg.bytes_written());
        }
    }
    assert_eq!(bg.events_lost(), 0);
    let want = inline.finish().unwrap();
    bg.finish().unwrap();
    assert_eq!(*shared.lock().unwrap(), want);
}

/// A write error on the compression thread shows at the next flush, and the events of the
/// chunks it could not write are counted as lost.
#[test]
fn background_compression_reports_write_errors() {
    struct FailAfter(usize);
    impl std::io::Write for FailAfter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.0 < b.len() {
                return Err(std::io::Error::other("disk full"));
            }
            self.0 -= b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = TraceWriter::new(FailAfter(200), &header()).unwrap();
    w.compress_in_background().unwrap();
    let recs = sample();
    for r in &recs {
        w.write(r).unwrap();
    }
    let e = w.flush().unwrap_err();
    assert!(e.to_string().contains("disk full"), "{e}");
    assert_eq!(w.events_lost(), recs.len() as u64);
    assert!(w.finish().is_err());
}

/// A compression thread that dies (here its output panics) is noticed at the next flush, and
/// the events handed to it count as lost rather than written.
#[test]
fn background_compression_reports_a_dead_thread() {
    struct Panics;
    impl std::io::Write for Panics {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if b.len() > 100 {
                panic!("the output fails hard");
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = TraceWriter::new(Panics, &header()).unwrap();
    w.set_compression(false);
    w.compress_in_background().unwrap();
    let recs: Vec<Record> = (0..20).flat_map(|_| sample()).collect();
    for r in &recs {
        w.write(r).unwrap();
    }
    assert!(w.flush().is_err(), "the dead thread is reported");
    assert!(w.events_lost() >= recs.len() as u64 - 1, "lost {}", w.events_lost());
    assert!(w.finish().is_err());
}

/// Every byte count of bincode's varint, in every field of the events the fast encoder
/// handles, encodes as bincode does.
#[test]
fn fast_encoder_agrees_with_bincode_at_varint_boundaries() {
    let edges = [0u64, 1, 250, 251, 252, 253, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, u64::MAX];
    for (i, &a) in edges.iter().enumerate() {
        let b = edges[(i + 3) % edges.len()];
        let c = edges[(i + 7) % edges.len()];
        let pool = if i % 2 == 0 { Pool::Small } else { Pool::Large };
        for event in [
            Event::Alloc { id: a, addr: b, requested_bytes: c, block_bytes: a, stream: b, pool, callsite: c as u32 },
            Event::FreeRequested { id: b, addr: c, callsite: a as u32 },
            Event::FreeCompleted { id: c, addr: a },
            Event::Split { addr: a, bytes: b, remainder_bytes: c },
            Event::Merge { addr: c, absorbed_addr: a, bytes: b },
        ] {
            let r = Record { time_ns: b, event };
            let mut ours = Vec::new();
            encode::record(&mut ours, &r);
            assert_eq!(ours, bincode::encode_to_vec(&r, cfg()).unwrap(), "{r:?}");
        }
    }
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![arb_event_a(), arb_event_b()]
}

fn arb_pool() -> impl Strategy<Value = Pool> {
    prop_oneof![Just(Pool::Small), Just(Pool::Large)]
}

fn arb_event_a() -> impl Strategy<Value = Event> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), arb_pool(), any::<u32>()).prop_map(
            |(id, addr, requested_bytes, block_bytes, stream, pool, callsite)| Event::Alloc {
                id,
                addr,
                requested_bytes,
                block_bytes,
                stream,
                pool,
                callsite
            }
        ),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(id, addr, callsite)| Event::FreeRequested {
            id,
            addr,
            callsite
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(id, addr)| Event::FreeCompleted { id, addr }),
        (0..4u8, any::<u64>(), any::<u64>(), any::<u64>(), arb_pool()).prop_map(
            |(k, addr, bytes, stream, pool)| match k {
                0 => Event::SegmentAlloc { addr, bytes, stream, pool },
                1 => Event::SegmentFree { addr, bytes, stream, pool },
                2 => Event::SegmentMap { addr, bytes, stream, pool },
                _ => Event::SegmentUnmap { addr, bytes, stream, pool },
            }
        ),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, bytes, remainder_bytes)| Event::Split {
            addr,
            bytes,
            remainder_bytes
        }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, absorbed_addr, bytes)| Event::Merge {
            addr,
            absorbed_addr,
            bytes
        }),
    ]
}

fn arb_event_b() -> impl Strategy<Value = Event> {
    let cause = prop_oneof![
        Just(ReleaseCause::EmptyCache),
        Just(ReleaseCause::OomRetry),
        Just(ReleaseCause::GarbageCollection),
        Just(ReleaseCause::Oversize)
    ];
    let mark = prop_oneof![Just(MarkKind::Phase), Just(MarkKind::Iteration), Just(MarkKind::Annotation)];
    prop_oneof![
        (cause, any::<u64>(), any::<u32>()).prop_map(|(cause, bytes, segments)| Event::CacheRelease {
            cause,
            bytes,
            segments
        }),
        proptest::array::uniform7(any::<u64>()).prop_map(|v| Event::Oom {
            requested_bytes: v[0],
            alloc_bytes: v[1],
            device_free_bytes: v[2],
            reserved_bytes: v[3],
            allocated_bytes: v[4],
            limit_bytes: v[5],
            stream: v[6]
        }),
        (mark, ".{0,40}").prop_map(|(kind, text)| Event::Mark { kind, text }),
        (any::<u32>(), proptest::collection::vec((".{0,20}", any::<u32>(), "[a-z_]{0,12}"), 0..4)).prop_map(
            |(id, fr)| {
                Event::CallSite {
                    id,
                    frames: fr.into_iter().map(|(file, line, function)| Frame { file, line, function }).collect(),
                }
            }
        ),
        any::<u64>().prop_map(|active_bytes| Event::Snapshot { active_bytes }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(free_bytes, total_bytes)| Event::DeviceMemInfo { free_bytes, total_bytes }),
        any::<u64>().prop_map(|events| Event::Dropped { events }),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(addr, a, b)| Event::SegmentPool { addr, pool_id: [a, b] }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_streams_round_trip(evs in proptest::collection::vec((any::<u64>(), arb_event()), 0..300), compress: bool) {
        let recs: Vec<Record> = evs.into_iter().map(|(time_ns, event)| Record { time_ns, event }).collect();
        let bytes = write(&recs, compress);
        let (got, end) = read(&bytes).unwrap();
        prop_assert_eq!(got, recs);
        prop_assert!(!end.is_partial());
    }

    /// Decoding a chunk a piece at a time hands over the records a whole decode gives, in
    /// order, in pieces of the size asked for (the last may be shorter), and stops when told.
    #[test]
    fn pieces_of_a_chunk_are_the_chunk(evs in proptest::collection::vec((any::<u64>(), arb_event()), 1..300),
                                        compress: bool, piece in 1usize..40, stop_after in 1usize..20) {
        let recs: Vec<Record> = evs.into_iter().map(|(time_ns, event)| Record { time_ns, event }).collect();
        let bytes = write(&recs, compress);
        let mut reader = TraceReader::new(&bytes[..]).unwrap();
        let mut decoder = ChunkDecoder::default();
        let (mut whole, mut pieced, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(chunk) = reader.next_raw_chunk() {
            decoder.decode(&chunk, &mut whole).unwrap();
            let mut buf = Vec::new();
            let mut take = |p: &mut Vec<Record>| {
                sizes.push(p.len());
                pieced.extend(p.iter().cloned());
                ControlFlow::Continue(())
            };
            let flow = decoder.decode_in_pieces(&chunk, piece, &mut buf, &mut take).unwrap();
            prop_assert!(flow.is_continue());
            let mut calls = 0;
            let mut stop = |_: &mut Vec<Record>| {
                calls += 1;
                if calls == stop_after { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            };
            let flow = decoder.decode_in_pieces(&chunk, piece, &mut Vec::new(), &mut stop).unwrap();
            let pieces = (chunk.count as usize).div_ceil(piece);
            prop_assert_eq!(flow.is_break(), stop_after <= pieces);
            prop_assert_eq!(calls, stop_after.min(pieces));
        }
        prop_assert_eq!(&whole, &recs);
        prop_assert_eq!(&pieced, &recs);
        prop_assert!(sizes.iter().all(|&n| n >= 1 && n <= piece));
    }

    #[test]
    fn fast_encoder_agrees_with_bincode(evs in proptest::collection::vec((any::<u64>(), arb_event()), 1..50)) {
        for (time_ns, event) in evs {
            let r = Record { time_ns, event };
            let mut ours = Vec::new();
            encode::record(&mut ours, &r);
            prop_assert_eq!(ours, bincode::encode_to_vec(&r, cfg()).unwrap());
        }
    }

    #[test]
    fn fast_decoder_agrees_with_bincode(evs in proptest::collection::vec((any::<u64>(), arb_event()), 1..50)) {
        let mut bytes = Vec::new();
        let recs: Vec<Record> = evs.into_iter().map(|(time_ns, event)| Record { time_ns, event }).collect();
        for r in &recs {
            bincode::encode_into_std_write(r, &mut bytes, cfg()).unwrap();
        }
        let mut dec = decode::Decoder::new(&bytes);
        for r in &recs {
            prop_assert_eq!(&dec.record().unwrap(), r);
        }
        prop_assert_eq!(dec.pos, bytes.len());
        // Any truncation is an error, never a panic.
        for cut in 0..bytes.len() {
            let mut dec = decode::Decoder::new(&bytes[..cut]);
            let mut ok = 0;
            while dec.record().is_ok() { ok += 1; }
            prop_assert!(ok <= recs.len());
        }
    }

    #[test]
    fn random_damage_never_panics(evs in proptest::collection::vec((any::<u64>(), arb_event()), 1..100),
                                  flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                  cut in any::<prop::sample::Index>()) {
        let recs: Vec<Record> = evs.into_iter().map(|(time_ns, event)| Record { time_ns, event }).collect();
        let mut bytes = write(&recs, true);
        for (i, x) in flips {
            let i = i.index(bytes.len());
            bytes[i] ^= x | 1;
        }
        let cut = cut.index(bytes.len() + 1);
        if let Ok((got, _)) = read(&bytes[..cut]) {
            // Whatever decodes is a prefix of what was written (checksums catch the flips).
            prop_assert_eq!(&recs[..got.len()], &got[..]);
        }
    }
}

/// A trace whose chunks are `bodies` as given (codec raw), with a matching trailer: the bytes a
/// hostile writer could make.
fn hand_made(chunks: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = write(&[], false);
    let trailer_len = u32::from_le_bytes(out[out.len() - 9 - 3..out.len() - 9 - 3 + 4].try_into().unwrap());
    assert_eq!(trailer_len, 3, "an empty trace's trailer is three zero varints");
    out.truncate(out.len() - 12);
    let mut frame = Vec::new();
    let mut events = 0;
    for (count, body) in chunks {
        let mut payload = vec![CODEC_RAW];
        push_varint(&mut payload, *count);
        push_varint(&mut payload, body.len() as u64);
        payload.extend_from_slice(body);
        frame_bytes(&mut out, &mut frame, KIND_CHUNK, &payload).unwrap();
        events += count;
    }
    let t = Trailer { events, chunks: chunks.len() as u64, dropped_events: 0 };
    frame_bytes(&mut out, &mut frame, KIND_TRAILER, &bincode::encode_to_vec(&t, cfg()).unwrap()).unwrap();
    out
}

#[test]
fn a_chunk_of_more_events_than_a_writer_makes_is_corrupt() {
    // 70,000 snapshot records of three bytes each: small, but more events than a chunk holds
    // (the decompression bomb had 256 M of them).
    let n = CHUNK_EVENTS as u64 + 4464;
    let body: Vec<u8> = (0..n).flat_map(|_| [0u8, 13, 0]).collect();
    let (got, end) = read(&hand_made(&[(n, body)])).unwrap();
    assert!(got.is_empty());
    let TraceEnd::Corrupt { reason, .. } = end else { panic!("{end:?}") };
    assert!(reason.contains("chunk claims 70000 events; a writer puts at most 65536"), "{reason}");
}

#[test]
fn a_call_site_of_more_frames_than_a_writer_keeps_is_corrupt() {
    // One call site of 2000 empty frames: [time 0, kind 12, id 1, count, (file "", line 0, fn "")*].
    let mut body = vec![0u8, 12, 1];
    push_varint(&mut body, 2000);
    body.extend((0..2000).flat_map(|_| [0u8, 0, 0]));
    let (_, end) = read(&hand_made(&[(1, body)])).unwrap();
    let TraceEnd::Corrupt { reason, .. } = end else { panic!("{end:?}") };
    assert!(reason.contains("call site 1 claims 2000 frames; a writer keeps at most 1024"), "{reason}");
}

#[test]
fn a_text_longer_than_a_writer_stores_is_corrupt() {
    // One annotation mark of 5000 bytes: [time 0, kind 11, mark kind 2, length, text].
    let mut body = vec![0u8, 11, 2];
    push_varint(&mut body, 5000);
    body.extend(std::iter::repeat_n(b'x', 5000));
    let (_, end) = read(&hand_made(&[(1, body)])).unwrap();
    let TraceEnd::Corrupt { reason, .. } = end else { panic!("{end:?}") };
    assert!(reason.contains("mark text of 5000 bytes; a writer cuts texts to 4096"), "{reason}");
}

#[test]
fn header_texts_and_lists_longer_than_a_writer_stores_are_refused() {
    let good = write(&sample(), true);
    // device_name ("Sim": a length byte and 3 bytes) is at payload byte 12, file byte 33.
    let long_name = with_header_payload(&good, |p| {
        let mut name = Vec::new();
        push_varint(&mut name, 5000);
        name.extend(std::iter::repeat_n(b'n', 5000));
        p.splice(12..16, name);
    });
    let e = TraceReader::new(&long_name[..]).err().unwrap();
    assert_eq!(
        e.to_string(),
        "corrupt trace at byte 33: header field `device_name` holds 5000 bytes (at most 4096), more than a writer stores"
    );
    // `notes`, the last field here (an empty list), holding 1025 empty strings.
    let many_notes = with_header_payload(&good, |p| {
        assert_eq!(p.pop(), Some(0));
        push_varint(p, 1025);
        p.extend(std::iter::repeat_n(0u8, 1025));
    });
    let e = TraceReader::new(&many_notes[..]).err().unwrap();
    assert!(
        e.to_string().contains("header field `notes` holds 1025 items (at most 1024), more than a writer stores"),
        "{e}"
    );
}

#[test]
fn the_writer_cuts_huge_labels_and_stacks_and_the_reader_takes_them() {
    let label = "x".repeat(3 << 20);
    let frame = Frame { file: "f.py".into(), line: 1, function: "é".repeat(5000) };
    let recs = vec![
        Record { time_ns: 1, event: Event::Mark { kind: MarkKind::Annotation, text: label } },
        Record { time_ns: 2, event: Event::CallSite { id: 1, frames: vec![frame; 3000] } },
        Record { time_ns: 3, event: Event::Snapshot { active_bytes: 7 } },
    ];
    for compress in [false, true] {
        let (got, end) = read(&write(&recs, compress)).unwrap();
        assert!(matches!(end, TraceEnd::Complete { .. }), "{end:?}");
        assert_eq!(got.len(), 3, "nothing after the huge records is lost");
        let Event::Mark { text, .. } = &got[0].event else { panic!() };
        assert_eq!(text.len(), MAX_TEXT_BYTES);
        assert!(text.ends_with("...[truncated: 3145728 bytes]"), "{}", &text[4000..]);
        let Event::CallSite { frames, .. } = &got[1].event else { panic!() };
        assert_eq!(frames.len(), MAX_CALLSITE_FRAMES);
        assert_eq!(frames.last().unwrap().function, "[truncated: 1977 more frames]");
        assert!(frames[0].function.len() <= MAX_TEXT_BYTES && frames[0].function.ends_with("[truncated: 10000 bytes]"));
        assert_eq!(got[2].event, Event::Snapshot { active_bytes: 7 });
    }
}

#[test]
fn many_deep_call_sites_are_spread_over_chunks_the_reader_accepts() {
    let frames: Vec<Frame> =
        (0..1000).map(|i| Frame { file: String::new(), line: i, function: String::new() }).collect();
    let recs: Vec<Record> = (0..600)
        .map(|i| Record { time_ns: i, event: Event::CallSite { id: i as u32 + 1, frames: frames.clone() } })
        .collect();
    let (got, end) = read(&write(&recs, true)).unwrap();
    let TraceEnd::Complete { trailer } = end else { panic!("{end:?}") };
    assert_eq!(got.len(), 600);
    assert_eq!(trailer.chunks, 3, "262 call sites of 1000 frames fill a chunk's frame budget");
}

#[test]
fn data_after_the_trailer_unknown_flags_and_version_0_are_refused() {
    let one = write(&sample(), true);
    let mut two = one.clone();
    two.extend_from_slice(&one);
    let (got, end) = read(&two).unwrap();
    assert_eq!(got, sample(), "every event before the garbage is read");
    assert_eq!(
        end,
        TraceEnd::Corrupt {
            offset: one.len() as u64,
            reason: "data after the trailer (a trace ends with its trailer; were files concatenated?)".into()
        }
    );
    let mut flagged = one.clone();
    flagged[10] = 4;
    let e = TraceReader::new(&flagged[..]).err().unwrap();
    assert_eq!(e.to_string(), "corrupt trace at byte 10: unknown flags 0x0004 (no flag is defined; the field is 0)");
    let mut v0 = one;
    v0[8] = 0;
    let e = TraceReader::new(&v0[..]).err().unwrap();
    assert_eq!(e.to_string(), "corrupt trace at byte 8: format version 0 does not exist (versions start at 1)");
}

/// Re-frames a trace's header with `edit` applied to its payload (checksum recomputed).
fn with_header_payload(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let mut payload = bytes[21..21 + len].to_vec();
    edit(&mut payload);
    let mut out = bytes[..12].to_vec();
    frame_bytes(&mut out, &mut Vec::new(), KIND_HEADER, &payload).unwrap();
    out.extend_from_slice(&bytes[21 + len..]);
    out
}

#[test]
fn header_errors_name_the_field_and_its_offset() {
    let good = write(&sample(), true);
    // tool_version "0.0.0-test" is a length byte then 10 bytes; source follows at payload byte 11.
    let bad_source = with_header_payload(&good, |p| p[11] = 9);
    let e = TraceReader::new(&bad_source[..]).err().unwrap();
    assert_eq!(e.to_string(), "corrupt trace at byte 32: header field `source` has unknown value 9");
    let bad_int = with_header_payload(&good, |p| p[11] = 0xff);
    let e = TraceReader::new(&bad_int[..]).err().unwrap();
    assert_eq!(e.to_string(), "corrupt trace at byte 32: header field `source` is not a valid integer");
    let cut = with_header_payload(&good, |p| p.truncate(20));
    let e = TraceReader::new(&cut[..]).err().unwrap();
    assert!(e.to_string().starts_with("corrupt trace at byte "), "{e}");
    assert!(e.to_string().contains("is cut short"), "{e}");
    assert!(!e.to_string().contains("UnexpectedEnd"), "{e}");
}

#[test]
fn header_settings_are_checked_as_a_command_line_is() {
    let mut h = header();
    h.config.large_segment_size = 0;
    let e = TraceWriter::new(Vec::new(), &h).err().unwrap();
    assert!(e.to_string().contains("large_segment_size_mb must be > 10 (got 0)"), "{e}");
    // The same settings in a file made by another writer: refused by the reader.
    let good = write(&sample(), true);
    let lss = crate::engine::config::LARGE_BUFFER;
    let bad = with_header_payload(&good, |p| {
        let enc = bincode::encode_to_vec(lss, cfg()).unwrap();
        let at = p.windows(enc.len()).rposition(|w| w == enc.as_slice()).unwrap();
        p.splice(at..at + enc.len(), [0u8]);
    });
    let e = TraceReader::new(&bad[..]).err().unwrap();
    assert!(
        e.to_string().contains(
            "header field `config` holds allocator settings that are refused: large_segment_size_mb must be > 10 (got 0)"
        ),
        "{e}"
    );
}
