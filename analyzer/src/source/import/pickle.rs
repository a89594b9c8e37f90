//! A pure-Rust reader of Python pickles (protocols 2 to 5, plus the cheap protocol 0/1 opcodes),
//! made for the plain data PyTorch memory snapshots hold: dicts, lists, tuples, ints, floats,
//! strings, bytes, booleans and `None`. Nothing is ever executed: `GLOBAL`, `REDUCE`, `BUILD`
//! and `NEWOBJ` build opaque [`Value::Object`]s.
//!
//! # Value model
//! [`Value`] is `Copy` and 24 bytes. Strings and bytes borrow from the input; containers are
//! indices into the [`Pickle`]'s arena, so a container referenced many times through the memo
//! (`BINGET`) is parsed once and every reference carries the same index: callers can intern by
//! identity (see [`Value::container_id`]).
//!
//! ```text
//! input  80 04 95 .. ]  94 (  K 01 K 02 e  .          PROTO 4, FRAME, EMPTY_LIST, MEMOIZE,
//!                                                    MARK, BININT1 1, BININT1 2, APPENDS, STOP
//! stack  [List(0)]                                   arena[0] = [Int(1), Int(2)]
//! memo   [List(0)]                                   a later BINGET 0 pushes List(0) again
//! ```
//!
//! # Safety against hostile input
//! Parsing never panics and never recurses. Every length field is checked against the bytes
//! that remain before anything is allocated, a memo key that is not the next one (Python's
//! pickler numbers them 0, 1, 2, ...) goes to a sparse map, so memory grows with the opcodes
//! read, never with the keys' values, and every error names the byte offset of the opcode that
//! failed.

use std::collections::HashMap;
use std::fmt;

/// An error of [`parse`], with the byte offset of the opcode at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickleError {
    #[error("truncated pickle at byte {offset}: {what}")]
    Truncated { offset: usize, what: String },
    #[error("unknown opcode 0x{opcode:02x} at byte {offset}")]
    UnknownOpcode { offset: usize, opcode: u8 },
    #[error("unsupported opcode {name} at byte {offset}")]
    Unsupported { offset: usize, name: &'static str },
    #[error("corrupt pickle at byte {offset}: {what}")]
    Corrupt { offset: usize, what: String },
}

impl PickleError {
    /// The byte offset the error refers to.
    pub fn offset(&self) -> usize {
        match self {
            PickleError::Truncated { offset, .. }
            | PickleError::UnknownOpcode { offset, .. }
            | PickleError::Unsupported { offset, .. }
            | PickleError::Corrupt { offset, .. } => *offset,
        }
    }
}

/// Index of a container in [`Pickle`]'s arena.
pub type ContainerId = u32;

/// One pickled value. Containers, big integers and owned strings live in the [`Pickle`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits: index into [`Pickle::big_int`].
    BigInt(u32),
    Float(f64),
    /// A string borrowed from the input (UTF-8 as pickled).
    Str(&'a str),
    /// A string that had to be decoded (`BINSTRING` with non-UTF-8 bytes, text opcodes):
    /// index into the pickle's owned strings.
    OwnedStr(u32),
    Bytes(&'a [u8]),
    List(ContainerId),
    Tuple(ContainerId),
    /// Keys and values alternate in the container: `k0, v0, k1, v1, ...`.
    Dict(ContainerId),
    Set(ContainerId),
    /// `GLOBAL`/`STACK_GLOBAL` (module, name): two strings in the container.
    Global(ContainerId),
    /// `REDUCE`/`NEWOBJ`/`BUILD`/persistent ids: `[callable-or-class, args, state...]`, never
    /// executed.
    Object(ContainerId),
}

impl Value<'_> {
    /// The arena index of a container (list, tuple, dict, set, global, object); equal ids mean
    /// the pickle referenced one object (through the memo).
    pub fn container_id(&self) -> Option<ContainerId> {
        match *self {
            Value::List(i) | Value::Tuple(i) | Value::Dict(i) | Value::Set(i) | Value::Global(i) | Value::Object(i) => {
                Some(i)
            }
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages ("list", "int", ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) | Value::OwnedStr(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::Global(_) => "global",
            Value::Object(_) => "object",
        }
    }
}

/// A wide integer: its value when it fits in `i128`, else saturated with `saturated` set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BigInt {
    pub value: i128,
    pub saturated: bool,
}

/// A parsed pickle: the root value and the arena it refers into.
pub struct Pickle<'a> {
    pub root: Value<'a>,
    /// The protocol of the `PROTO` opcode; 0 when there was none.
    pub protocol: u8,
    containers: Vec<Vec<Value<'a>>>,
    big_ints: Vec<BigInt>,
    strings: Vec<String>,
}

impl<'a> Pickle<'a> {
    /// The items of a list, tuple, set, global or object; the alternating keys and values of a
    /// dict. Empty for non-containers.
    pub fn items(&self, v: Value<'a>) -> &[Value<'a>] {
        match v.container_id() {
            Some(i) => self.containers.get(i as usize).map(Vec::as_slice).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The items of a list or tuple; `None` for anything else.
    pub fn seq(&self, v: Value<'a>) -> Option<&[Value<'a>]> {
        match v {
            Value::List(_) | Value::Tuple(_) => Some(self.items(v)),
            _ => None,
        }
    }

    /// The `(key, value)` pairs of a dict; `None` for anything else.
    pub fn dict(&self, v: Value<'a>) -> Option<DictIter<'_, 'a>> {
        match v {
            Value::Dict(_) => Some(DictIter { items: self.items(v) }),
            _ => None,
        }
    }

    /// The value of the string key `key` in dict `v` (linear search: snapshot dicts are small).
    pub fn get(&self, v: Value<'a>, key: &str) -> Option<Value<'a>> {
        self.dict(v)?.find(|(k, _)| self.str(*k) == Some(key)).map(|(_, v)| v)
    }

    /// The text of a string value.
    pub fn str(&self, v: Value<'a>) -> Option<&str> {
        match v {
            Value::Str(s) => Some(s),
            Value::OwnedStr(i) => self.strings.get(i as usize).map(String::as_str),
            _ => None,
        }
    }

    /// A wide integer's value.
    pub fn big_int(&self, index: u32) -> BigInt {
        self.big_ints.get(index as usize).copied().unwrap_or(BigInt { value: 0, saturated: true })
    }

    /// An integer (or bool) as `i128`; saturated big integers give their saturated value.
    pub fn int(&self, v: Value<'a>) -> Option<i128> {
        match v {
            Value::Int(i) => Some(i as i128),
            Value::Bool(b) => Some(b as i128),
            Value::BigInt(i) => Some(self.big_int(i).value),
            _ => None,
        }
    }

    /// An integer that fits in `u64` (negative or wider values give `None`).
    pub fn u64(&self, v: Value<'a>) -> Option<u64> {
        match v {
            Value::Int(i) => u64::try_from(i).ok(),
            Value::Bool(b) => Some(b as u64),
            Value::BigInt(i) => {
                let b = self.big_int(i);
                if b.saturated {
                    None
                } else {
                    u64::try_from(b.value).ok()
                }
            }
            _ => None,
        }
    }

    /// A float, or an integer converted to one.
    pub fn f64(&self, v: Value<'a>) -> Option<f64> {
        match v {
            Value::Float(f) => Some(f),
            _ => self.int(v).map(|i| i as f64),
        }
    }

    /// Number of containers in the arena (each memoized container counted once).
    pub fn container_count(&self) -> usize {
        self.containers.len()
    }
}

/// Iterator over a dict's `(key, value)` pairs.
pub struct DictIter<'p, 'a> {
    items: &'p [Value<'a>],
}

impl<'a> Iterator for DictIter<'_, 'a> {
    type Item = (Value<'a>, Value<'a>);
    fn next(&mut self) -> Option<Self::Item> {
        match self.items {
            [k, v, rest @ ..] => {
                let kv = (*k, *v);
                self.items = rest;
                Some(kv)
            }
            _ => None,
        }
    }
}

impl fmt::Debug for Pickle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pickle")
            .field("root", &self.root)
            .field("protocol", &self.protocol)
            .field("containers", &self.containers.len())
            .finish()
    }
}

// Opcodes (pickletools names).
const MARK: u8 = b'(';
const STOP: u8 = b'.';
const POP: u8 = b'0';
const POP_MARK: u8 = b'1';
const DUP: u8 = b'2';
const FLOAT: u8 = b'F';
const INT: u8 = b'I';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const LONG: u8 = b'L';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const PERSID: u8 = b'P';
const BINPERSID: u8 = b'Q';
const REDUCE: u8 = b'R';
const STRING: u8 = b'S';
const BINSTRING: u8 = b'T';
const SHORT_BINSTRING: u8 = b'U';
const UNICODE: u8 = b'V';
const BINUNICODE: u8 = b'X';
const APPEND: u8 = b'a';
const BUILD: u8 = b'b';
const GLOBAL: u8 = b'c';
const DICT: u8 = b'd';
const EMPTY_DICT: u8 = b'}';
const APPENDS: u8 = b'e';
const GET: u8 = b'g';
const BINGET: u8 = b'h';
const INST: u8 = b'i';
const LONG_BINGET: u8 = b'j';
const LIST: u8 = b'l';
const EMPTY_LIST: u8 = b']';
const OBJ: u8 = b'o';
const PUT: u8 = b'p';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const SETITEM: u8 = b's';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const SETITEMS: u8 = b'u';
const BINFLOAT: u8 = b'G';
const PROTO: u8 = 0x80;
const NEWOBJ: u8 = 0x81;
const EXT1: u8 = 0x82;
const EXT2: u8 = 0x83;
const EXT4: u8 = 0x84;
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const BINBYTES: u8 = b'B';
const SHORT_BINBYTES: u8 = b'C';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE8: u8 = 0x8d;
const BINBYTES8: u8 = 0x8e;
const EMPTY_SET: u8 = 0x8f;
const ADDITEMS: u8 = 0x90;
const FROZENSET: u8 = 0x91;
const NEWOBJ_EX: u8 = 0x92;
const STACK_GLOBAL: u8 = 0x93;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;
const BYTEARRAY8: u8 = 0x96;
const NEXT_BUFFER: u8 = 0x97;
const READONLY_BUFFER: u8 = 0x98;

/// Parses a whole pickle. Trailing bytes after `STOP` are ignored (as Python does).
pub fn parse(data: &[u8]) -> Result<Pickle<'_>, PickleError> {
    Parser::new(data).run()
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    /// Start of the opcode being executed (for error offsets).
    op_at: usize,
    stack: Vec<Value<'a>>,
    /// Positions in `stack` where each open `MARK` was set.
    marks: Vec<usize>,
    memo: Vec<Option<Value<'a>>>,
    sparse_memo: HashMap<u64, Value<'a>>,
    /// Number of distinct memo keys stored (`MEMOIZE` uses it as the next key, like Python).
    memo_len: u64,
    out: Pickle<'a>,
}

impl<'a> Parser<'a> {
    fn new(data: &'a [u8]) -> Self {
        Parser {
            data,
            pos: 0,
            op_at: 0,
            // A snapshot's stack stays shallow; its memo grows with the distinct strings and
            // containers, roughly one per 20 input bytes.
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            memo: Vec::with_capacity((data.len() / 20).min(1 << 24)),
            sparse_memo: HashMap::new(),
            memo_len: 0,
            out: Pickle {
                root: Value::None,
                protocol: 0,
                containers: Vec::with_capacity((data.len() / 40).min(1 << 24)),
                big_ints: Vec::new(),
                strings: Vec::new(),
            },
        }
    }

    fn truncated(&self, what: impl Into<String>) -> PickleError {
        PickleError::Truncated { offset: self.op_at, what: what.into() }
    }

    fn corrupt(&self, what: impl Into<String>) -> PickleError {
        PickleError::Corrupt { offset: self.op_at, what: what.into() }
    }

    #[inline]
    fn take(&mut self, n: usize, name: &str) -> Result<&'a [u8], PickleError> {
        let remain = self.data.len() - self.pos;
        if n > remain {
            return Err(self.truncated(format!("{name} needs {n} bytes, {remain} remain")));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self, name: &str) -> Result<u8, PickleError> {
        Ok(self.take(1, name)?[0])
    }

    #[inline]
    fn u16(&mut self, name: &str) -> Result<u16, PickleError> {
        let b = self.take(2, name)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u32(&mut self, name: &str) -> Result<u32, PickleError> {
        let b = self.take(4, name)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, name: &str) -> Result<u64, PickleError> {
        let b = self.take(8, name)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length field: it must fit in the remaining input (checked by `take` afterwards too;
    /// this gives the clearer message before any conversion).
    fn len_u64(&mut self, name: &str) -> Result<usize, PickleError> {
        let n = self.u64(name)?;
        let remain = (self.data.len() - self.pos) as u64;
        if n > remain {
            return Err(self.truncated(format!("{name} announces {n} bytes, {remain} remain")));
        }
        Ok(n as usize)
    }

    /// A `\n`-terminated line (text opcodes), without the newline.
    fn line(&mut self, name: &str) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(self.truncated(format!("{name} has no terminating newline"))),
        }
    }

    #[inline]
    fn pop(&mut self, name: &str) -> Result<Value<'a>, PickleError> {
        match self.stack.pop() {
            Some(v) => {
                if let Some(&m) = self.marks.last() {
                    if self.stack.len() < m {
                        return Err(self.corrupt(format!("{name} pops past a MARK")));
                    }
                }
                Ok(v)
            }
            None => Err(self.corrupt(format!("{name} on an empty stack"))),
        }
    }

    #[inline]
    fn top(&mut self, name: &str) -> Result<&mut Value<'a>, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.corrupt(format!("{name} on an empty stack")));
        }
        Ok(self.stack.last_mut().expect("checked non-empty"))
    }

    /// Pops everything down to the last MARK.
    fn pop_mark(&mut self, name: &str) -> Result<Vec<Value<'a>>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.corrupt(format!("{name} without a MARK")))?;
        Ok(self.stack.split_off(m))
    }

    fn new_container(&mut self, items: Vec<Value<'a>>) -> Result<ContainerId, PickleError> {
        let id = u32::try_from(self.out.containers.len()).map_err(|_| self.corrupt("too many containers"))?;
        self.out.containers.push(items);
        Ok(id)
    }

    /// Stores a memo entry: densely when `key` is at most the dense memo's length (a key that
    /// replaces one or appends the next), else in the sparse map. A key far beyond the memo
    /// costs one map entry, not a run of empty slots (a 5 KB pickle of such keys took 1.5 GB).
    #[inline]
    fn memo_put(&mut self, key: u64, v: Value<'a>) {
        let dense = usize::try_from(key).ok().filter(|&k| k <= self.memo.len());
        let fresh = match dense {
            Some(k) => {
                let was_sparse = !self.sparse_memo.is_empty() && self.sparse_memo.remove(&key).is_some();
                if k == self.memo.len() {
                    self.memo.push(Some(v));
                    !was_sparse
                } else {
                    self.memo[k].replace(v).is_none() && !was_sparse
                }
            }
            None => self.sparse_memo.insert(key, v).is_none(),
        };
        self.memo_len += fresh as u64;
    }

    #[inline]
    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        let dense = usize::try_from(key).ok().and_then(|k| self.memo.get(k).copied().flatten());
        let v = dense.or_else(|| self.sparse_memo.get(&key).copied());
        match v {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(self.corrupt(format!("memo key {key} was never stored"))),
        }
    }

    fn utf8(&mut self, b: &'a [u8]) -> Value<'a> {
        match std::str::from_utf8(b) {
            Ok(s) => Value::Str(s),
            Err(_) => {
                // Python writes lone surrogates with `surrogatepass`; keep what can be kept.
                self.owned_str(String::from_utf8_lossy(b).into_owned())
            }
        }
    }

    fn owned_str(&mut self, s: String) -> Value<'a> {
        let i = self.out.strings.len() as u32;
        self.out.strings.push(s);
        Value::OwnedStr(i)
    }

    /// Little-endian two's complement integer of any width.
    fn long(&mut self, b: &[u8]) -> Value<'a> {
        if b.is_empty() {
            return Value::Int(0);
        }
        let negative = b[b.len() - 1] & 0x80 != 0;
        if b.len() <= 8 {
            let mut a = [if negative { 0xff } else { 0 }; 8];
            a[..b.len()].copy_from_slice(b);
            return Value::Int(i64::from_le_bytes(a));
        }
        // Strip redundant sign-extension bytes, then see whether it fits in i128.
        let ext = if negative { 0xff } else { 0 };
        let mut n = b.len();
        while n > 1 && b[n - 1] == ext && (b[n - 2] & 0x80 != 0) == negative {
            n -= 1;
        }
        let big = if n <= 16 {
            let mut a = [ext; 16];
            a[..n].copy_from_slice(&b[..n]);
            BigInt { value: i128::from_le_bytes(a), saturated: false }
        } else {
            BigInt { value: if negative { i128::MIN } else { i128::MAX }, saturated: true }
        };
        if !big.saturated {
            if let Ok(v) = i64::try_from(big.value) {
                return Value::Int(v);
            }
        }
        let i = self.out.big_ints.len() as u32;
        self.out.big_ints.push(big);
        Value::BigInt(i)
    }

    fn text_int(&mut self, line: &[u8], name: &str) -> Result<Value<'a>, PickleError> {
        let s = std::str::from_utf8(line).map_err(|_| self.corrupt(format!("{name} is not ASCII")))?;
        let s = s.trim().trim_end_matches('L');
        match s {
            "00" => return Ok(Value::Bool(false)),
            "01" => return Ok(Value::Bool(true)),
            _ => {}
        }
        if let Ok(v) = s.parse::<i64>() {
            return Ok(Value::Int(v));
        }
        let big = match s.parse::<i128>() {
            Ok(v) => BigInt { value: v, saturated: false },
            Err(_) if !s.is_empty() && s.trim_start_matches('-').bytes().all(|c| c.is_ascii_digit()) => {
                BigInt { value: if s.starts_with('-') { i128::MIN } else { i128::MAX }, saturated: true }
            }
            Err(_) => return Err(self.corrupt(format!("{name} `{s}` is not an integer"))),
        };
        let i = self.out.big_ints.len() as u32;
        self.out.big_ints.push(big);
        Ok(Value::BigInt(i))
    }

    fn run(mut self) -> Result<Pickle<'a>, PickleError> {
        loop {
            self.op_at = self.pos;
            let Some(&op) = self.data.get(self.pos) else {
                return Err(PickleError::Truncated { offset: self.pos, what: "the input ends before STOP".into() });
            };
            self.pos += 1;
            match op {
                PROTO => {
                    let p = self.u8("PROTO")?;
                    if p > 5 {
                        return Err(self.corrupt(format!("unsupported protocol {p}")));
                    }
                    self.out.protocol = p;
                }
                FRAME => {
                    // Frames only bound reads; the whole input is in memory already.
                    self.u64("FRAME")?;
                }
                STOP => {
                    let root = self.pop("STOP")?;
                    if !self.marks.is_empty() {
                        return Err(self.corrupt("STOP with an open MARK"));
                    }
                    self.out.root = root;
                    return Ok(self.out);
                }
                MARK => self.marks.push(self.stack.len()),
                POP => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        // POP of a bare MARK (Python allows it).
                        self.marks.pop();
                    } else {
                        self.pop("POP")?;
                    }
                }
                POP_MARK => {
                    self.pop_mark("POP_MARK")?;
                }
                DUP => {
                    let v = *self.top("DUP")?;
                    self.stack.push(v);
                }
                NONE => self.stack.push(Value::None),
                NEWTRUE => self.stack.push(Value::Bool(true)),
                NEWFALSE => self.stack.push(Value::Bool(false)),
                BININT => {
                    let v = self.u32("BININT")? as i32;
                    self.stack.push(Value::Int(v as i64));
                }
                BININT1 => {
                    let v = self.u8("BININT1")?;
                    self.stack.push(Value::Int(v as i64));
                }
                BININT2 => {
                    let v = self.u16("BININT2")?;
                    self.stack.push(Value::Int(v as i64));
                }
                LONG1 => {
                    let n = self.u8("LONG1")? as usize;
                    let b = self.take(n, "LONG1")?;
                    let v = self.long(b);
                    self.stack.push(v);
                }
                LONG4 => {
                    let n = self.u32("LONG4")?;
                    let n = usize::try_from(n).map_err(|_| self.corrupt("LONG4 length"))?;
                    let b = self.take(n, "LONG4")?;
                    let v = self.long(b);
                    self.stack.push(v);
                }
                INT | LONG => {
                    let name = if op == INT { "INT" } else { "LONG" };
                    let line = self.line(name)?;
                    let v = self.text_int(line, name)?;
                    self.stack.push(v);
                }
                BINFLOAT => {
                    let b = self.take(8, "BINFLOAT")?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.stack.push(Value::Float(f64::from_be_bytes(a)));
                }
                FLOAT => {
                    let line = self.line("FLOAT")?;
                    let f = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.corrupt("FLOAT is not a number"))?;
                    self.stack.push(Value::Float(f));
                }
                SHORT_BINUNICODE => {
                    let n = self.u8("SHORT_BINUNICODE")? as usize;
                    let b = self.take(n, "SHORT_BINUNICODE")?;
                    let v = self.utf8(b);
                    self.stack.push(v);
                }
                BINUNICODE => {
                    let n = self.u32("BINUNICODE")? as usize;
                    let b = self.take(n, "BINUNICODE")?;
                    let v = self.utf8(b);
                    self.stack.push(v);
                }
                BINUNICODE8 => {
                    let n = self.len_u64("BINUNICODE8")?;
                    let b = self.take(n, "BINUNICODE8")?;
                    let v = self.utf8(b);
                    self.stack.push(v);
                }
                SHORT_BINSTRING | BINSTRING => {
                    let (n, name) = if op == SHORT_BINSTRING {
                        (self.u8("SHORT_BINSTRING")? as usize, "SHORT_BINSTRING")
                    } else {
                        let n = self.u32("BINSTRING")? as i32;
                        if n < 0 {
                            return Err(self.corrupt(format!("BINSTRING with negative length {n}")));
                        }
                        (n as usize, "BINSTRING")
                    };
                    let b = self.take(n, name)?;
                    // Python 2 `str`: bytes; decode as UTF-8 where valid, else Latin-1.
                    let v = match std::str::from_utf8(b) {
                        Ok(s) => Value::Str(s),
                        Err(_) => self.owned_str(b.iter().map(|&c| c as char).collect()),
                    };
                    self.stack.push(v);
                }
                SHORT_BINBYTES => {
                    let n = self.u8("SHORT_BINBYTES")? as usize;
                    let b = self.take(n, "SHORT_BINBYTES")?;
                    self.stack.push(Value::Bytes(b));
                }
                BINBYTES => {
                    let n = self.u32("BINBYTES")? as usize;
                    let b = self.take(n, "BINBYTES")?;
                    self.stack.push(Value::Bytes(b));
                }
                BINBYTES8 | BYTEARRAY8 => {
                    let name = if op == BINBYTES8 { "BINBYTES8" } else { "BYTEARRAY8" };
                    let n = self.len_u64(name)?;
                    let b = self.take(n, name)?;
                    self.stack.push(Value::Bytes(b));
                }
                EMPTY_LIST => {
                    let id = self.new_container(Vec::new())?;
                    self.stack.push(Value::List(id));
                }
                EMPTY_DICT => {
                    let id = self.new_container(Vec::new())?;
                    self.stack.push(Value::Dict(id));
                }
                EMPTY_TUPLE => {
                    let id = self.new_container(Vec::new())?;
                    self.stack.push(Value::Tuple(id));
                }
                EMPTY_SET => {
                    let id = self.new_container(Vec::new())?;
                    self.stack.push(Value::Set(id));
                }
                TUPLE1 | TUPLE2 | TUPLE3 => {
                    let n = (op - TUPLE1 + 1) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.corrupt(format!("TUPLE{n} needs {n} items on the stack")));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let id = self.new_container(items)?;
                    self.stack.push(Value::Tuple(id));
                }
                TUPLE | LIST | FROZENSET => {
                    let name = match op {
                        TUPLE => "TUPLE",
                        LIST => "LIST",
                        _ => "FROZENSET",
                    };
                    let items = self.pop_mark(name)?;
                    let id = self.new_container(items)?;
                    self.stack.push(match op {
                        TUPLE => Value::Tuple(id),
                        LIST => Value::List(id),
                        _ => Value::Set(id),
                    });
                }
                DICT => {
                    let items = self.pop_mark("DICT")?;
                    if items.len() % 2 != 0 {
                        return Err(self.corrupt("DICT with an odd number of items"));
                    }
                    let id = self.new_container(items)?;
                    self.stack.push(Value::Dict(id));
                }
                APPEND => {
                    let v = self.pop("APPEND")?;
                    let target = *self.top("APPEND")?;
                    self.extend(target, &[v], "APPEND")?;
                }
                APPENDS => self.extend_from_mark("APPENDS", false)?,
                ADDITEMS => self.extend_from_mark("ADDITEMS", false)?,
                SETITEM => {
                    let v = self.pop("SETITEM")?;
                    let k = self.pop("SETITEM")?;
                    let target = *self.top("SETITEM")?;
                    self.extend(target, &[k, v], "SETITEM")?;
                }
                SETITEMS => self.extend_from_mark("SETITEMS", true)?,
                PUT => {
                    let line = self.line("PUT")?;
                    let key = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .ok_or_else(|| self.corrupt("PUT key is not a number"))?;
                    let v = *self.top("PUT")?;
                    self.memo_put(key, v);
                }
                BINPUT => {
                    let key = self.u8("BINPUT")? as u64;
                    let v = *self.top("BINPUT")?;
                    self.memo_put(key, v);
                }
                LONG_BINPUT => {
                    let key = self.u32("LONG_BINPUT")? as u64;
                    let v = *self.top("LONG_BINPUT")?;
                    self.memo_put(key, v);
                }
                MEMOIZE => {
                    let v = *self.top("MEMOIZE")?;
                    if self.memo_len == self.memo.len() as u64 {
                        // Only MEMOIZE so far: the memo is dense and this appends.
                        self.memo.push(Some(v));
                        self.memo_len += 1;
                    } else {
                        self.memo_put(self.memo_len, v);
                    }
                }
                GET => {
                    let line = self.line("GET")?;
                    let key = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .ok_or_else(|| self.corrupt("GET key is not a number"))?;
                    self.memo_get(key)?;
                }
                BINGET => {
                    let key = self.u8("BINGET")? as u64;
                    // The hot path of a snapshot (half its opcodes are memo gets): a dense hit.
                    match self.memo.get(key as usize) {
                        Some(Some(v)) => self.stack.push(*v),
                        _ => self.memo_get(key)?,
                    }
                }
                LONG_BINGET => {
                    let key = self.u32("LONG_BINGET")? as u64;
                    match self.memo.get(key as usize) {
                        Some(Some(v)) => self.stack.push(*v),
                        _ => self.memo_get(key)?,
                    }
                }
                GLOBAL => {
                    let module = self.line("GLOBAL")?;
                    let name = self.line("GLOBAL")?;
                    let (m, n) = (self.utf8(module), self.utf8(name));
                    let id = self.new_container(vec![m, n])?;
                    self.stack.push(Value::Global(id));
                }
                STACK_GLOBAL => {
                    let n = self.pop("STACK_GLOBAL")?;
                    let m = self.pop("STACK_GLOBAL")?;
                    let id = self.new_container(vec![m, n])?;
                    self.stack.push(Value::Global(id));
                }
                REDUCE | NEWOBJ => {
                    let name = if op == REDUCE { "REDUCE" } else { "NEWOBJ" };
                    let args = self.pop(name)?;
                    let callable = self.pop(name)?;
                    let id = self.new_container(vec![callable, args])?;
                    self.stack.push(Value::Object(id));
                }
                NEWOBJ_EX => {
                    let kwargs = self.pop("NEWOBJ_EX")?;
                    let args = self.pop("NEWOBJ_EX")?;
                    let cls = self.pop("NEWOBJ_EX")?;
                    let id = self.new_container(vec![cls, args, kwargs])?;
                    self.stack.push(Value::Object(id));
                }
                BUILD => {
                    let state = self.pop("BUILD")?;
                    let target = *self.top("BUILD")?;
                    match target {
                        Value::Object(_) => self.extend(target, &[state], "BUILD")?,
                        _ => {
                            // BUILD on a non-object (e.g. a dict subclass): wrap it, opaque.
                            let id = self.new_container(vec![target, Value::None, state])?;
                            *self.top("BUILD")? = Value::Object(id);
                        }
                    }
                }
                BINPERSID => {
                    let pid = self.pop("BINPERSID")?;
                    let id = self.new_container(vec![Value::None, pid])?;
                    self.stack.push(Value::Object(id));
                }
                PERSID => {
                    let line = self.line("PERSID")?;
                    let pid = self.utf8(line);
                    let id = self.new_container(vec![Value::None, pid])?;
                    self.stack.push(Value::Object(id));
                }
                STRING => return Err(PickleError::Unsupported { offset: self.op_at, name: "STRING" }),
                UNICODE => return Err(PickleError::Unsupported { offset: self.op_at, name: "UNICODE" }),
                INST => return Err(PickleError::Unsupported { offset: self.op_at, name: "INST" }),
                OBJ => return Err(PickleError::Unsupported { offset: self.op_at, name: "OBJ" }),
                EXT1 | EXT2 | EXT4 => return Err(PickleError::Unsupported { offset: self.op_at, name: "EXT" }),
                NEXT_BUFFER | READONLY_BUFFER => {
                    return Err(PickleError::Unsupported { offset: self.op_at, name: "out-of-band buffer" })
                }
                other => return Err(PickleError::UnknownOpcode { offset: self.op_at, opcode: other }),
            }
        }
    }

    /// `APPENDS`, `SETITEMS`, `ADDITEMS`: moves the items above the last MARK straight into
    /// the container just below the MARK (no intermediate vector).
    fn extend_from_mark(&mut self, name: &str, pairs: bool) -> Result<(), PickleError> {
        let Some(m) = self.marks.pop() else {
            return Err(self.corrupt(format!("{name} without a MARK")));
        };
        let floor = self.marks.last().copied().unwrap_or(0);
        if m == 0 || m <= floor {
            return Err(self.corrupt(format!("{name} on an empty stack")));
        }
        let target = self.stack[m - 1];
        self.check_target(target, name)?;
        if pairs && (self.stack.len() - m) & 1 != 0 {
            return Err(self.corrupt(format!("{name} with an odd number of items")));
        }
        let id = target.container_id().expect("checked a container") as usize;
        let Some(c) = self.out.containers.get_mut(id) else {
            return Err(self.corrupt(format!("{name} on a missing container")));
        };
        c.extend_from_slice(&self.stack[m..]);
        self.stack.truncate(m);
        Ok(())
    }

    fn check_target(&self, target: Value<'a>, name: &str) -> Result<(), PickleError> {
        let ok = matches!(
            (target, name),
            (Value::List(_), "APPEND" | "APPENDS")
                | (Value::Set(_), "ADDITEMS")
                | (Value::Dict(_), "SETITEM" | "SETITEMS")
                | (Value::Object(_), _)
        );
        if ok {
            Ok(())
        } else {
            Err(self.corrupt(format!("{name} on a {}", target.type_name())))
        }
    }

    /// Appends items to a list/set/object or key-value pairs to a dict.
    fn extend(&mut self, target: Value<'a>, items: &[Value<'a>], name: &str) -> Result<(), PickleError> {
        self.check_target(target, name)?;
        let id = target.container_id().expect("containers have ids") as usize;
        match self.out.containers.get_mut(id) {
            Some(c) => {
                c.extend_from_slice(items);
                Ok(())
            }
            None => Err(self.corrupt(format!("{name} on a missing container"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_is_truncated_at_byte_0() {
        let e = parse(b"").unwrap_err();
        assert_eq!(e.to_string(), "truncated pickle at byte 0: the input ends before STOP");
    }

    #[test]
    fn unknown_opcode_names_offset() {
        let e = parse(b"\x80\x04\xff").unwrap_err();
        assert_eq!(e.to_string(), "unknown opcode 0xff at byte 2");
    }

    #[test]
    fn hostile_binunicode8_length_does_not_allocate() {
        let mut p = b"\x80\x04\x8d".to_vec();
        p.extend_from_slice(&(1u64 << 60).to_le_bytes());
        p.extend_from_slice(b"abc.");
        let e = parse(&p).unwrap_err();
        assert!(matches!(e, PickleError::Truncated { offset: 2, .. }), "{e}");
        assert!(e.to_string().contains("1152921504606846976"), "{e}");
    }

    #[test]
    fn long1_of_nine_bytes() {
        // 2**64 + 5: LONG1 with 9 bytes.
        let p = b"\x80\x02\x8a\x09\x05\x00\x00\x00\x00\x00\x00\x00\x01.";
        let pk = parse(p).unwrap();
        assert_eq!(pk.int(pk.root), Some((1i128 << 64) + 5));
        assert_eq!(pk.u64(pk.root), None);
        // -1 encoded redundantly over 9 bytes fits in an i64.
        let p = b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff.";
        assert_eq!(parse(p).unwrap().root, Value::Int(-1));
    }

    #[test]
    fn long4_wider_than_i128_saturates() {
        let mut p = b"\x80\x02\x8b".to_vec();
        p.extend_from_slice(&20u32.to_le_bytes());
        p.extend_from_slice(&[0x11; 20]);
        p.push(b'.');
        let pk = parse(&p).unwrap();
        let Value::BigInt(i) = pk.root else { panic!("{:?}", pk.root) };
        assert_eq!(pk.big_int(i), BigInt { value: i128::MAX, saturated: true });
    }

    #[test]
    fn memo_shares_containers() {
        // [[1], <memo 1>]: EMPTY_LIST MEMOIZE MARK EMPTY_LIST MEMOIZE K1 APPEND BINGET 1 APPENDS STOP
        let p = b"\x80\x04]\x94(]\x94K\x01ah\x01e.";
        let pk = parse(p).unwrap();
        let items = pk.seq(pk.root).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
        assert_eq!(pk.seq(items[0]).unwrap(), &[Value::Int(1)]);
        assert_eq!(pk.container_count(), 2);
    }

    #[test]
    fn stack_underflow_and_mark_errors() {
        assert!(matches!(parse(b"\x80\x04e.").unwrap_err(), PickleError::Corrupt { offset: 2, .. }));
        assert!(matches!(parse(b"\x80\x04a.").unwrap_err(), PickleError::Corrupt { offset: 2, .. }));
        assert!(matches!(parse(b"\x80\x04(.").unwrap_err(), PickleError::Corrupt { offset: 3, .. }));
        assert!(matches!(parse(b"\x80\x04h\x05.").unwrap_err(), PickleError::Corrupt { offset: 2, .. }));
        // APPENDS onto an int.
        assert!(matches!(parse(b"\x80\x04K\x01(K\x02e.").unwrap_err(), PickleError::Corrupt { offset: 7, .. }));
    }

    #[test]
    fn text_opcodes_of_protocol_0() {
        // (lp0\nI12\naL99999999999999999999\naF1.5\na.  (protocol 0 list)
        let p = b"(lp0\nI12\naL99999999999999999999L\naF1.5\nag0\na.";
        let pk = parse(p).unwrap();
        let items = pk.seq(pk.root).unwrap();
        assert_eq!(items[0], Value::Int(12));
        assert_eq!(pk.int(items[1]), Some(99999999999999999999));
        assert_eq!(items[2], Value::Float(1.5));
        assert_eq!(items[3], pk.root);
    }

    #[test]
    fn globals_and_reduce_are_opaque() {
        // cbuiltins\nset\n ( ) R . : builtins.set(()) never executed.
        let p = b"\x80\x02cbuiltins\nset\n)\x85R.";
        let pk = parse(p).unwrap();
        let Value::Object(_) = pk.root else { panic!("{:?}", pk.root) };
        let g = pk.items(pk.root)[0];
        assert_eq!(pk.str(pk.items(g)[0]), Some("builtins"));
        assert_eq!(pk.str(pk.items(g)[1]), Some("set"));
    }
}
