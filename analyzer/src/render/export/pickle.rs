//! A small streaming writer of Python pickles, protocol 2: the protocol PyTorch's own C++
//! snapshot writer uses, and one that PyTorch's memory_viz page reads (it fails on protocol 5).
//!
//! Values are written as they come; containers are opened, filled and closed by the caller
//! (`begin_dict`, key, value, ..., `end_dict`). Items go out in batches under a MARK, as
//! Python's pickler writes them. A value written once can be kept in the memo (`memo_put`) and
//! referred to again (`memo_get`): snapshots share one frame list among every entry of a call
//! site, and so does this writer.
//!
//! Integers: 0..=255 `BININT1`, ..=65535 `BININT2`, i32 `BININT`, else `LONG1` with the fewest
//! bytes (never more than 8 for the numbers of a snapshot: MemoryViz.js refuses wider ones).

use std::io::{self, Write};

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const TUPLE2: u8 = 0x86;
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const BINUNICODE: u8 = b'X';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items per MARK ... SETITEMS/APPENDS batch (Python's pickler uses 1000).
const BATCH: usize = 1000;

/// An open container: how many items went in since the last MARK.
struct Open {
    dict: bool,
    pending: usize,
}

/// Writes one pickle. Call [`PickleWriter::finish`] after the top-level value.
pub struct PickleWriter<W: Write> {
    out: W,
    stack: Vec<Open>,
    next_memo: u32,
    /// Strings written through [`PickleWriter::name`], and their memo slots.
    names: Vec<(&'static str, u32)>,
}

impl<W: Write> PickleWriter<W> {
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[PROTO, 2])?;
        Ok(PickleWriter { out, stack: Vec::new(), next_memo: 0, names: Vec::new() })
    }

    /// Counts a value written into the innermost container (a key and its value count as two).
    fn item(&mut self) -> io::Result<()> {
        let Some(top) = self.stack.last_mut() else { return Ok(()) };
        if top.pending == 0 {
            self.out.write_all(&[MARK])?;
        }
        Ok(())
    }

    /// After a value: close the batch when it is full (a dict's batch closes after a value).
    fn after(&mut self) -> io::Result<()> {
        let Some(top) = self.stack.last_mut() else { return Ok(()) };
        top.pending += 1;
        let per_item = if top.dict { 2 } else { 1 };
        if top.pending >= BATCH * per_item {
            let op = if top.dict { SETITEMS } else { APPENDS };
            top.pending = 0;
            self.out.write_all(&[op])?;
        }
        Ok(())
    }

    pub fn none(&mut self) -> io::Result<()> {
        self.item()?;
        self.out.write_all(&[NONE])?;
        self.after()
    }

    pub fn bool(&mut self, b: bool) -> io::Result<()> {
        self.item()?;
        self.out.write_all(&[if b { NEWTRUE } else { NEWFALSE }])?;
        self.after()
    }

    pub fn int(&mut self, v: i128) -> io::Result<()> {
        self.item()?;
        match v {
            0..=0xff => self.out.write_all(&[BININT1, v as u8])?,
            0x100..=0xffff => {
                self.out.write_all(&[BININT2])?;
                self.out.write_all(&(v as u16).to_le_bytes())?;
            }
            _ if i32::try_from(v).is_ok() => {
                self.out.write_all(&[BININT])?;
                self.out.write_all(&(v as i32).to_le_bytes())?;
            }
            _ => {
                // Two's complement, little-endian, with as few bytes as keep the sign.
                let bytes = v.to_le_bytes();
                let mut n = 16;
                while n > 1 {
                    let top = bytes[n - 1];
                    let below_sign = bytes[n - 2] & 0x80;
                    if (top == 0 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                        n -= 1;
                    } else {
                        break;
                    }
                }
                self.out.write_all(&[LONG1, n as u8])?;
                self.out.write_all(&bytes[..n])?;
            }
        }
        self.after()
    }

    pub fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(v as i128)
    }

    pub fn float(&mut self, v: f64) -> io::Result<()> {
        self.item()?;
        self.out.write_all(&[BINFLOAT])?;
        self.out.write_all(&v.to_be_bytes())?;
        self.after()
    }

    pub fn str(&mut self, s: &str) -> io::Result<()> {
        self.item()?;
        self.out.write_all(&[BINUNICODE])?;
        self.out.write_all(&(s.len() as u32).to_le_bytes())?;
        self.out.write_all(s.as_bytes())?;
        self.after()
    }

    /// A pair of integers (a snapshot's `segment_pool_id`).
    pub fn int_pair(&mut self, a: i128, b: i128) -> io::Result<()> {
        self.item()?;
        // The two ints go straight onto the stack, outside any batch counting.
        let saved = std::mem::take(&mut self.stack);
        let r = self.int(a).and_then(|_| self.int(b));
        self.stack = saved;
        r?;
        self.out.write_all(&[TUPLE2])?;
        self.after()
    }

    fn begin(&mut self, dict: bool) -> io::Result<()> {
        self.item()?;
        self.out.write_all(&[if dict { EMPTY_DICT } else { EMPTY_LIST }])?;
        self.stack.push(Open { dict, pending: 0 });
        Ok(())
    }

    pub fn begin_dict(&mut self) -> io::Result<()> {
        self.begin(true)
    }

    pub fn begin_list(&mut self) -> io::Result<()> {
        self.begin(false)
    }

    fn end(&mut self) -> io::Result<()> {
        let top = self.stack.pop().expect("end without begin");
        if top.pending > 0 {
            debug_assert!(!top.dict || top.pending & 1 == 0, "a dict key without its value");
            self.out.write_all(&[if top.dict { SETITEMS } else { APPENDS }])?;
        }
        self.after()
    }

    pub fn end_dict(&mut self) -> io::Result<()> {
        debug_assert!(self.stack.last().is_some_and(|o| o.dict));
        self.end()
    }

    pub fn end_list(&mut self) -> io::Result<()> {
        debug_assert!(self.stack.last().is_some_and(|o| !o.dict));
        self.end()
    }

    /// Keeps the value just written (a container: right after its `begin_*`) in the memo and
    /// returns its slot for [`PickleWriter::memo_get`].
    ///
    /// For a container, call it right after `begin_*`: the memo then holds the container
    /// object, which is filled in place, as Python's pickler does.
    pub fn memo_put(&mut self) -> io::Result<u32> {
        let slot = self.next_memo;
        self.next_memo += 1;
        if slot < 256 {
            self.out.write_all(&[BINPUT, slot as u8])?;
        } else {
            self.out.write_all(&[LONG_BINPUT])?;
            self.out.write_all(&slot.to_le_bytes())?;
        }
        Ok(slot)
    }

    /// The value kept in `slot`, again.
    pub fn memo_get(&mut self, slot: u32) -> io::Result<()> {
        self.item()?;
        if slot < 256 {
            self.out.write_all(&[BINGET, slot as u8])?;
        } else {
            self.out.write_all(&[LONG_BINGET])?;
            self.out.write_all(&slot.to_le_bytes())?;
        }
        self.after()
    }

    /// A string that recurs (a dict key, an action): written once, then referred to through
    /// the memo (two bytes instead of a copy), as Python's pickler does with the one string
    /// object that every dict shares as a key.
    pub fn name(&mut self, s: &'static str) -> io::Result<()> {
        if let Some(&(_, slot)) = self.names.iter().find(|(n, _)| *n == s) {
            return self.memo_get(slot);
        }
        self.str(s)?;
        let slot = self.memo_put()?;
        self.names.push((s, slot));
        Ok(())
    }

    /// A key and a string value.
    pub fn kv_str(&mut self, k: &'static str, v: &str) -> io::Result<()> {
        self.name(k)?;
        self.str(v)
    }

    /// A key and an integer value.
    pub fn kv_uint(&mut self, k: &'static str, v: u64) -> io::Result<()> {
        self.name(k)?;
        self.uint(v)
    }

    /// Writes STOP and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        assert!(self.stack.is_empty(), "unclosed container");
        self.out.write_all(&[STOP])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::import::pickle::{parse, Value};

    /// Everything the writer writes reads back through the importer's pickle reader (and
    /// through Python's, in the package's tests): integers at every width boundary, floats,
    /// strings, nested containers past a batch, a shared list through the memo.
    #[test]
    fn round_trips_through_the_reader() {
        let ints: Vec<i128> = vec![
            0,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -129,
            i32::MAX as i128,
            i32::MAX as i128 + 1,
            1 << 47,
            (1 << 63) - 1,
            -(1 << 40),
        ];
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_dict().unwrap();
        w.name("ints").unwrap();
        w.begin_list().unwrap();
        for &i in &ints {
            w.int(i).unwrap();
        }
        w.end_list().unwrap();
        w.name("many").unwrap();
        w.begin_list().unwrap();
        // Written in place the first time (an item of `many` itself), then by reference.
        let shared = {
            w.begin_list().unwrap();
            let slot = w.memo_put().unwrap();
            w.str("frame").unwrap();
            w.end_list().unwrap();
            slot
        };
        for _ in 0..2500 {
            w.memo_get(shared).unwrap();
        }
        w.end_list().unwrap();
        w.kv_str("s", "höhe").unwrap();
        w.name("f").unwrap();
        w.float(0.6).unwrap();
        w.name("t").unwrap();
        w.int_pair(0, 0).unwrap();
        w.name("b").unwrap();
        w.bool(true).unwrap();
        w.name("n").unwrap();
        w.none().unwrap();
        w.end_dict().unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(&bytes[..2], &[0x80, 2]);

        let pk = parse(&bytes).unwrap();
        let root = pk.root;
        let got: Vec<i128> =
            pk.seq(pk.get(root, "ints").unwrap()).unwrap().iter().map(|v| pk.int(*v).unwrap()).collect();
        assert_eq!(got, ints);
        let many = pk.seq(pk.get(root, "many").unwrap()).unwrap();
        assert_eq!(many.len(), 2501);
        assert!(many.iter().all(|v| v.container_id() == many[0].container_id()), "one shared list");
        assert_eq!(pk.seq(many[0]).unwrap().len(), 1);
        assert_eq!(pk.str(pk.get(root, "s").unwrap()), Some("höhe"));
        assert_eq!(pk.f64(pk.get(root, "f").unwrap()), Some(0.6));
        assert!(matches!(pk.get(root, "t"), Some(Value::Tuple(_))));
        assert!(matches!(pk.get(root, "b"), Some(Value::Bool(true))));
        assert!(matches!(pk.get(root, "n"), Some(Value::None)));
    }
}
