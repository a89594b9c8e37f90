//! Opening and streaming a trace file: errors that name the file, a progress bar on a terminal,
//! and decoding on worker threads (chunks are independent) while analyses fold records in order.
//!
//! Memory is bounded by a few chunks whatever the trace's size, and by
//! [`RECORDS_IN_FLIGHT`] decoded records or two chunks, whichever is more, whatever the chunks'
//! size.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use recorder::trace::{ChunkDecoder, Header, RawChunk, Record, TraceEnd, TraceError, TraceReader};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex};

/// Decoded records that the workers of one scan may hold before the fold takes them (about
/// 64 bytes each). Chunks of a few thousand records never reach it, so every worker keeps
/// decoding; a writer may make chunks of up to 32 MiB, millions of records each, and there it
/// keeps memory to two such chunks (one decoded while the fold takes the other) however many
/// cores decode.
pub const RECORDS_IN_FLIGHT: u64 = 1 << 20;

/// Most events a trace may decode to per byte of its file, besides one full chunk. A recording
/// takes about a byte or more per event: 0.13 to 1.25 events per byte on every shipped trace,
/// fixture, synthetic benchmark trace and predicted stream, and 1.6 for a snapshot of a tight
/// loop of one allocation, one call site and a microsecond or two between events. But zstd
/// compresses a chunk of identical events almost to nothing: 12 KB of them decoded to 6.5 M
/// events and kept `report` busy for 10 s. Past the bound, the rest of the trace is treated as
/// damage (analyzed up to there, exit 3), so time stays in proportion to the file's size.
/// `ALLOCTRACE_MAX_EVENTS_PER_BYTE` sets another bound; 0 lifts it.
pub const MAX_EVENTS_PER_BYTE: u64 = 4;

/// The events a file of `bytes` may decode to: (events per byte, the most events), with a
/// chunk's worth however small the file; None where the bound is lifted.
pub fn events_allowed(bytes: u64) -> Option<(u64, u64)> {
    let per_byte = std::env::var("ALLOCTRACE_MAX_EVENTS_PER_BYTE")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(MAX_EVENTS_PER_BYTE);
    (per_byte > 0)
        .then(|| (per_byte, per_byte.saturating_mul(bytes).saturating_add(recorder::trace::CHUNK_EVENTS as u64)))
}

/// The damage a trace that decodes past [`events_allowed`] ends with, at the chunk that passes.
fn too_expanded(offset: u64, bytes: u64, (per_byte, allowed): (u64, u64)) -> TraceEnd {
    TraceEnd::Corrupt {
        offset,
        reason: format!(
            "the chunk here would take the trace past {allowed} events ({per_byte} per byte of its {bytes}-byte \
file, and a chunk), far more than a recording holds (a decompression bomb?; ALLOCTRACE_MAX_EVENTS_PER_BYTE=0 \
reads on)"
        ),
    }
}

/// Records (and chunks) handed to the decoders and not yet folded: the reader waits while the
/// records pass [`RECORDS_IN_FLIGHT`], but two chunks are always let through, however large, so
/// that one is decoded while the fold takes the other.
#[derive(Default)]
struct InFlight {
    /// (records, chunks)
    held: Mutex<(u64, u64)>,
    folded: Condvar,
}

impl InFlight {
    /// Waits for room for a chunk of `n` records, then counts it; false once `stop` is set.
    fn take(&self, n: u64, stop: &AtomicBool) -> bool {
        let Ok(mut held) = self.held.lock() else { return false };
        while held.1 >= 2 && held.0.saturating_add(n) > RECORDS_IN_FLIGHT {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            held = match self.folded.wait_timeout(held, std::time::Duration::from_millis(50)) {
                Ok((h, _)) => h,
                Err(_) => return false,
            };
        }
        *held = (held.0.saturating_add(n), held.1 + 1);
        true
    }

    /// A chunk of `n` records folded (or drained).
    fn give(&self, n: u64) {
        if let Ok(mut held) = self.held.lock() {
            *held = (held.0.saturating_sub(n), held.1.saturating_sub(1));
            self.folded.notify_all();
        }
    }
}

/// A decoded chunk: the index of its first record, the records its head counts (taken from
/// [`InFlight`]), and the records or why they could not be decoded.
type Decoded = (u64, u64, Result<Vec<Record>, TraceError>);

/// Gives a chunk's records back to [`InFlight`] when dropped (after its fold, or when drained).
struct Give<'a>(&'a InFlight, u64);

impl Drop for Give<'_> {
    fn drop(&mut self) {
        self.0.give(self.1);
    }
}

/// What a complete scan of a trace saw, besides what the fold computed.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub path: PathBuf,
    pub header: Header,
    pub events: u64,
    pub end: TraceEnd,
}

impl Scanned {
    /// A one-line warning when the trace was damaged: which file, where, and what was kept.
    pub fn damage_warning(&self) -> Option<String> {
        self.end.is_partial().then(|| {
            format!(
                "{}: {}; analyzed the {} events before the damage",
                self.path.display(),
                self.end.describe(),
                self.events
            )
        })
    }
}

/// Counts bytes read, for the progress bar.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens a trace and reads its header; errors name the file (and the byte offset, if any).
pub fn open(path: &Path) -> Result<TraceReader<BufReader<File>>> {
    TraceReader::open(path).map_err(|e| open_error(path, e))
}

fn open_error(path: &Path, e: TraceError) -> anyhow::Error {
    match e {
        TraceError::Io(io) => anyhow::Error::new(io).context(format!("cannot read {}", path.display())),
        other => anyhow::anyhow!("{}: {other}", path.display()),
    }
}

/// A progress bar over `total` bytes, drawn only when stderr is a terminal.
pub fn byte_progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Reads the whole trace at `path`, calling `fold(index, record)` for every record in order.
/// Decoding runs on a second thread, a few chunks ahead.
pub fn scan(path: &Path, mut fold: impl FnMut(u64, &Record)) -> Result<Scanned> {
    scan_chunks(path, |first, chunk| {
        for (i, r) in chunk.iter().enumerate() {
            fold(first + i as u64, r);
        }
    })
}

/// Like [`scan`], one decoded chunk at a time (`first` = index of its first record).
///
/// A reader thread reads and checksums frames; chunks are independent, so a pool of workers
/// (one per core) decompresses and decodes them; this thread folds them in order. In flight
/// are at most a few chunks per worker, so memory stays bounded whatever the trace's size.
pub fn scan_chunks(path: &Path, mut fold: impl FnMut(u64, &[Record])) -> Result<Scanned> {
    scan_chunks_until(path, |first, chunk| {
        fold(first, chunk);
        ControlFlow::Continue(())
    })
}

/// Like [`scan_chunks`], until `fold` breaks (the rest of the file is then not read; the
/// returned event count is of the records folded).
pub fn scan_chunks_until(path: &Path, fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>) -> Result<Scanned> {
    scan_chunks_from(path, 0, fold)
}

/// Like [`scan_chunks_until`], from the chunk that holds record `from`: the chunks before it are
/// read but not decoded (a replay resumed from a checkpoint).
pub fn scan_chunks_from(
    path: &Path,
    from: u64,
    mut fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>,
) -> Result<Scanned> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let count = Arc::new(AtomicU64::new(0));
    // A pass on a busy pool (below) reads a frame at a time into the frame's own buffer: a
    // small read buffer serves it as well.
    let on_pool = rayon::current_thread_index().is_some();
    let buffer = if on_pool { 64 << 10 } else { 1 << 20 };
    let input = Counting { inner: BufReader::with_capacity(buffer, file), count: count.clone() };
    let mut reader = TraceReader::new(input).map_err(|e| open_error(path, e))?;
    let header = reader.header().clone();
    let bar = byte_progress(total, "reading");
    let allowed = events_allowed(total);
    // Inside a parallel computation (what-if replays on rayon's pool) the cores are already
    // busy with other passes: a pass holds a few thousand records, however many run at once.
    if on_pool {
        let (events, end) = scan_pieces(&mut reader, from, allowed, total, &count, &bar, fold);
        bar.finish_and_clear();
        return Ok(Scanned { path: path.to_path_buf(), header, events, end });
    }
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 8);
    let (work_tx, work_rx) = sync_channel::<(u64, (u64, RawChunk))>(workers);
    let work_rx = Mutex::new(work_rx);
    let (done_tx, done_rx) = sync_channel::<(u64, Decoded)>(workers);
    let (recycle_tx, recycle_rx) = channel::<Vec<Record>>();
    let recycle_rx = Mutex::new(recycle_rx);
    let stop = AtomicBool::new(false);
    let in_flight = InFlight::default();
    let (events, end) = std::thread::scope(|s| {
        let reader_thread = s.spawn(|| {
            let mut seq = 0u64;
            let read = ChunkRead { reader: &mut reader, from, allowed, total, stop: &stop };
            let end = read.chunks(|first, chunk| {
                if !in_flight.take(chunk.count, &stop) || work_tx.send((seq, (first, chunk))).is_err() {
                    return ControlFlow::Break(None);
                }
                seq += 1;
                ControlFlow::Continue(())
            });
            drop(work_tx);
            end
        });
        for _ in 0..workers {
            let done_tx = done_tx.clone();
            let (work_rx, recycle_rx) = (&work_rx, &recycle_rx);
            s.spawn(move || {
                let mut decoder = ChunkDecoder::default();
                loop {
                    let job = match work_rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => break,
                    };
                    let Ok((seq, (first, chunk))) = job else { break };
                    let mut buf = recycle_rx.lock().ok().and_then(|rx| rx.try_recv().ok()).unwrap_or_default();
                    buf.clear();
                    let result = decoder.decode(&chunk, &mut buf).map(|()| buf);
                    if done_tx.send((seq, (first, chunk.count, result))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        // Fold in order; after the first damaged chunk, drain without folding.
        let mut waiting: BTreeMap<u64, Decoded> = BTreeMap::new();
        let (mut next, mut events) = (0u64, 0u64);
        let mut failure: Option<TraceError> = None;
        for (seq, result) in done_rx {
            waiting.insert(seq, result);
            while let Some((first, records, result)) = waiting.remove(&next) {
                next += 1;
                // Counted out by the reader before decoding (`InFlight`): back once folded.
                let _given = Give(&in_flight, records);
                match result {
                    Ok(chunk) if failure.is_none() && !stop.load(Ordering::Relaxed) => {
                        let flow = fold(first, &chunk);
                        events = first + chunk.len() as u64;
                        if flow.is_break() {
                            stop.store(true, Ordering::Relaxed);
                        }
                        bar.set_position(count.load(Ordering::Relaxed));
                        let _ = recycle_tx.send(chunk);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if failure.is_none() {
                            failure = Some(e);
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        let read_end = reader_thread
            .join()
            .unwrap_or_else(|_| TraceEnd::Corrupt { offset: 0, reason: "reader thread failed".into() });
        let end = match failure {
            Some(e) => recorder::trace::end_of(e, 0),
            None => read_end,
        };
        (events, end)
    });
    bar.finish_and_clear();
    Ok(Scanned { path: path.to_path_buf(), header, events, end })
}

/// Records a pass on a busy pool decodes and folds at a time (256 KiB of them): a chunk holds up
/// to 65,536 (4 MiB), and a what-if table runs a pass for each replay at once.
const PIECE_RECORDS: usize = 4096;

/// Pieces of [`PIECE_RECORDS`] a pass on a busy pool lets its decoder get ahead of its fold.
const PIECES_AHEAD: usize = 2;

/// Passes running on the pool now ([`scan_pieces`]).
static POOL_PASSES: AtomicUsize = AtomicUsize::new(0);

/// [`scan_chunks_from`] for a pass on rayon's pool: each chunk read and decoded
/// [`PIECE_RECORDS`] at a time, so that a pass holds a few pieces instead of a few chunks.
/// While the pool's threads outnumber twice the passes running on it, a decoder thread reads
/// and decodes a few pieces ahead of this thread's fold (on cores that would otherwise wait);
/// past that every core has a pass, and this thread decodes its own pieces. Returns the records
/// folded and how the trace ended. The records of a chunk that turns out damaged are folded up
/// to the damage (the trace's passes stop at the end its first read found,
/// [`crate::model::Trace`]).
fn scan_pieces<R: Read + Send>(
    reader: &mut TraceReader<R>,
    from: u64,
    allowed: Option<(u64, u64)>,
    total: u64,
    count: &AtomicU64,
    bar: &ProgressBar,
    mut fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>,
) -> (u64, TraceEnd) {
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            POOL_PASSES.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let _running = Running;
    let passes = POOL_PASSES.fetch_add(1, Ordering::Relaxed) + 1;
    let stop = AtomicBool::new(false);
    let events = std::cell::Cell::new(0u64);
    let mut fold_piece = |at: u64, piece: &[Record]| {
        let flow = fold(at, piece);
        events.set(at + piece.len() as u64);
        bar.set_position(count.load(Ordering::Relaxed));
        flow
    };
    if 2 * passes > rayon::current_num_threads() {
        let read = ChunkRead { reader, from, allowed, total, stop: &stop };
        let end = read.pieces(|at, piece| fold_piece(at, piece));
        return (events.get(), end);
    }
    let (pieces_tx, pieces_rx) = sync_channel::<(u64, Vec<Record>)>(PIECES_AHEAD);
    let (back_tx, back_rx) = channel::<Vec<Record>>();
    std::thread::scope(|s| {
        let stop = &stop;
        let decoder = s.spawn(move || {
            ChunkRead { reader, from, allowed, total, stop }.pieces(|at, records| {
                let piece = std::mem::replace(records, back_rx.try_recv().unwrap_or_default());
                match pieces_tx.send((at, piece)) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(_) => ControlFlow::Break(()),
                }
            })
        });
        for (at, mut piece) in pieces_rx.iter() {
            let flow = fold_piece(at, &piece);
            piece.clear();
            let _ = back_tx.send(piece);
            if flow.is_break() {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
        drop(pieces_rx);
        let end =
            decoder.join().unwrap_or_else(|_| TraceEnd::Corrupt { offset: 0, reason: "decoder thread failed".into() });
        (events.get(), end)
    })
}

/// Where a pass reads: its reader, the record it starts at, and what bounds it (the records the
/// file may expand to, [`events_allowed`], against its `total` bytes; `stop`, set by the pass).
struct ChunkRead<'a, R: Read> {
    reader: &'a mut TraceReader<R>,
    from: u64,
    allowed: Option<(u64, u64)>,
    total: u64,
    stop: &'a AtomicBool,
}

impl<R: Read> ChunkRead<'_, R> {
    /// Decodes the chunks from the one holding record `from` [`PIECE_RECORDS`] at a time,
    /// handing `piece(index of its first record, records)` each piece (it may take them), until
    /// the trace ends, `piece` breaks or `stop` is set. Returns how the trace ended.
    fn pieces(self, mut piece: impl FnMut(u64, &mut Vec<Record>) -> ControlFlow<()>) -> TraceEnd {
        let mut decoder = ChunkDecoder::default();
        let mut buf: Vec<Record> = Vec::new();
        self.chunks(|first, chunk| {
            buf.clear();
            let mut at = first;
            let mut each = |records: &mut Vec<Record>| {
                let n = records.len() as u64;
                let flow = piece(at, records);
                at += n;
                flow
            };
            match decoder.decode_in_pieces(&chunk, PIECE_RECORDS, &mut buf, &mut each) {
                Ok(ControlFlow::Continue(())) => ControlFlow::Continue(()),
                Ok(ControlFlow::Break(())) => ControlFlow::Break(None),
                Err(e) => ControlFlow::Break(Some(recorder::trace::end_of(e, 0))),
            }
        })
    }

    /// Hands `chunk(index of its first record, chunk)` each chunk from the one holding record
    /// `from` (those before it are read, not decoded), until the trace ends, `stop` is set or
    /// `chunk` breaks (with the end to return, or `None` for the reader's), or the trace decodes
    /// past [`events_allowed`]. Returns how the trace ended.
    fn chunks(self, mut chunk: impl FnMut(u64, RawChunk) -> ControlFlow<Option<TraceEnd>>) -> TraceEnd {
        let ChunkRead { reader, from, allowed, total, stop } = self;
        let mut first = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let Some(raw) = reader.next_raw_chunk() else { break };
            let next = first.saturating_add(raw.count);
            if let Some(allowed) = allowed.filter(|&(_, most)| next > most && !stop.load(Ordering::Relaxed)) {
                return too_expanded(raw.offset, total, allowed);
            }
            if next > from {
                match chunk(first, raw) {
                    ControlFlow::Continue(()) => {}
                    ControlFlow::Break(Some(end)) => return end,
                    ControlFlow::Break(None) => break,
                }
            }
            first = next;
        }
        reader.end().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recorder::trace::{Event, Source, TraceWriter};

    /// 50 chunks of 100 events; returns the file and the offsets where each chunk frame starts.
    fn many_chunks(name: &str) -> (PathBuf, Vec<u64>) {
        let path = std::env::temp_dir().join(format!("alloctrace-scan-{}-{name}.atrace", std::process::id()));
        let mut w = TraceWriter::create(&path, &Header::new(Source::Simulated)).unwrap();
        let mut offsets = Vec::new();
        for i in 0..5000u64 {
            if i % 100 == 0 {
                offsets.push(w.bytes_written());
            }
            w.write(&Record { time_ns: i, event: Event::Snapshot { active_bytes: i } }).unwrap();
            if i % 100 == 99 {
                w.flush().unwrap();
            }
        }
        w.finish().unwrap();
        (path, offsets)
    }

    /// Two chunks always pass, however large (one decoded while the other is folded); past the
    /// budget the reader waits until the fold gives records back (here it is told to stop
    /// instead, and gives up).
    #[test]
    fn records_in_flight_are_bounded() {
        let (f, stop) = (InFlight::default(), AtomicBool::new(false));
        assert!(f.take(3 * RECORDS_IN_FLIGHT, &stop) && f.take(3 * RECORDS_IN_FLIGHT, &stop));
        stop.store(true, Ordering::Relaxed);
        assert!(!f.take(1, &stop));
        f.give(3 * RECORDS_IN_FLIGHT);
        f.give(3 * RECORDS_IN_FLIGHT);
        // Small chunks pass until their records reach the budget.
        for _ in 0..4 {
            assert!(f.take(RECORDS_IN_FLIGHT / 4, &stop));
        }
        assert!(!f.take(1, &stop));
        // A reader waiting for room goes on once the fold gives some back.
        stop.store(false, Ordering::Relaxed);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| f.take(RECORDS_IN_FLIGHT / 4, &stop));
            std::thread::sleep(std::time::Duration::from_millis(20));
            f.give(RECORDS_IN_FLIGHT / 4);
            assert!(waiter.join().unwrap());
        });
    }

    #[test]
    fn parallel_scan_folds_in_order() {
        let (path, _) = many_chunks("order");
        let mut seen = Vec::new();
        let s = scan(&path, |i, r| seen.push((i, r.time_ns))).unwrap();
        assert_eq!(s.events, 5000);
        assert!(matches!(s.end, TraceEnd::Complete { .. }));
        assert!(seen.iter().enumerate().all(|(k, &(i, t))| i == k as u64 && t == k as u64));
        std::fs::remove_file(path).ok();
    }

    /// A pass on the pool (decoded a piece at a time: on its own thread where the pool has one
    /// thread, on a decoder thread beside it where the pool has four) folds the same records,
    /// from the same starts, and ends the same way as one with a pool of decoders, on an intact
    /// trace and a damaged one.
    #[test]
    fn a_pass_on_a_busy_pool_folds_what_a_threaded_pass_folds() {
        let (path, offsets) = many_chunks("inline");
        let damaged = path.with_extension("damaged.atrace");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[offsets[20] as usize + 20] ^= 0x55;
        std::fs::write(&damaged, &bytes).unwrap();
        let pools = [1, 4].map(|n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap());
        for (p, pool) in [&path, &damaged].into_iter().flat_map(|p| pools.iter().map(move |pool| (p, pool))) {
            for from in [0, 150, 4999] {
                let run = |inline: bool| {
                    let mut seen = Vec::new();
                    let mut scan = || {
                        scan_chunks_from(p, from, |first, chunk| {
                            seen.extend(chunk.iter().enumerate().map(|(k, r)| (first + k as u64, r.time_ns)));
                            ControlFlow::Continue(())
                        })
                        .unwrap()
                    };
                    let s = if inline { pool.install(&mut scan) } else { scan() };
                    (s.events, s.end, seen)
                };
                let (threaded, inline) = (run(false), run(true));
                assert!(!threaded.2.is_empty() || from == 4999);
                assert_eq!(threaded, inline, "{} from {from}", p.display());
            }
        }
        std::fs::remove_file(path).ok();
        std::fs::remove_file(damaged).ok();
    }

    #[test]
    fn parallel_scan_stops_at_a_damaged_chunk() {
        let (path, offsets) = many_chunks("damage");
        let mut bytes = std::fs::read(&path).unwrap();
        let at = offsets[20] as usize;
        bytes[at + 20] ^= 0x55; // inside chunk 20's payload
        std::fs::write(&path, &bytes).unwrap();
        let mut last = None;
        let s = scan(&path, |i, _| last = Some(i)).unwrap();
        assert_eq!(s.events, 2000, "the 20 chunks before the damage");
        assert_eq!(last, Some(1999));
        assert_eq!(s.end, TraceEnd::Corrupt { offset: at as u64, reason: "frame checksum mismatch".into() });
        std::fs::remove_file(path).ok();
    }
}
