//! The allocator's knobs, parsed from and printed as a `PYTORCH_CUDA_ALLOC_CONF` string.
//!
//! ```text
//! max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:True
//! ```
//! Keys are separated by `,` (a bracketed list may hold commas), key and value by `:`.
//! Unknown keys are kept verbatim so that a configuration round-trips.

use bincode::{Decode, Encode};
use serde::Serialize;
use std::fmt;

pub const MIB: u64 = 1 << 20;
/// Every block is a multiple of this.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request (after rounding) served by the small pool.
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool, and its expandable page size.
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Segment size for requests between 1 and 10 MiB; default `max_non_split_rounding`.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Below this (and above 1 MiB) a large request gets a whole `LARGE_BUFFER` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Segments for requests of at least 10 MiB are rounded up to this.
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Number of power-of-two intervals of `roundup_power2_divisions`.
pub const ROUNDUP_INTERVALS: usize = 16;

/// The allocator's configuration: the knobs of `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Encode, Decode, Serialize, Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks at least this large are never split; `None` = unlimited (the default).
    pub max_split_size: Option<u64>,
    /// An oversize block may serve a request at most this much smaller than itself.
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval `[2^i MiB, 2^(i+1) MiB)`; 0 or 1 = plain rounding.
    pub roundup_power2_divisions: [u32; ROUNDUP_INTERVALS],
    /// Fraction of the capacity above which old cached segments are freed; needs a capacity.
    pub garbage_collection_threshold: Option<f64>,
    /// Map pages into one growing segment per stream and pool instead of `cudaMalloc`.
    pub expandable_segments: bool,
    /// Segment size for 1-10 MiB requests, and the expandable page size of the large pool.
    pub large_segment_size: u64,
    /// Keys this engine does not act on, kept verbatim (`key`, `value`).
    pub other: Vec<(String, String)>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: None,
            expandable_segments: false,
            large_segment_size: LARGE_BUFFER,
            other: Vec::new(),
        }
    }
}

/// The settings this engine applies.
pub const MODELLED_KEYS: [&str; 10] = [
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "large_segment_size_mb",
    "garbage_collection_threshold",
    "expandable_segments",
    "roundup_power2_divisions",
    "backend",
    "throw_on_cudamalloc_oom",
    "per_process_memory_fraction",
    "expandable_segments_reserve",
];

/// PyTorch's other allocator settings: kept verbatim, changing none of the engine's decisions
/// (host-memory pinning, the lock around `cudaMalloc`, CUDA-graph capture), or acting only on
/// streams that code (not the settings) assigns to a reserve class.
pub const UNMODELLED_KEYS: [&str; 10] = [
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
    "pinned_free_catch_all",
    "expandable_segments_reserve_by_class",
];

impl AllocatorConfig {
    /// `garbage_collection_threshold`'s trigger under a limit of `capacity` bytes: reserved
    /// memory above it makes a request that misses the cache free old cached segments first
    /// (PyTorch `garbage_collect_cached_blocks`: `threshold * allowed_memory_maximum`). `None`
    /// without the setting.
    pub fn gc_trigger_bytes(&self, capacity: u64) -> Option<u64> {
        self.garbage_collection_threshold.filter(|t| *t > 0.0).map(|t| (t * capacity as f64) as u64)
    }

    /// True when `self` and `other` serve a request stream whose largest request is
    /// `largest_request` bytes in exactly the same way, under any capacity
    /// ([`AllocatorConfig::same_run`] says why).
    pub fn same_run_as(&self, other: &AllocatorConfig, largest_request: u64) -> bool {
        self.same_run(other, largest_request).is_some()
    }

    /// Why two different settings, `self` and `other`, serve a request stream whose largest
    /// request is `largest_request` bytes in exactly the same way, under any capacity, if they
    /// do (`None` for equal settings: there is nothing to explain). They may differ in two
    /// things only, each where the stream cannot tell:
    ///
    /// - **`max_split_size` (and `max_non_split_rounding`)**, where neither maps expandable
    ///   segments and no block of such a stream can reach either split size. From PyTorch's
    ///   `CUDACachingAllocator.cpp`: `max_split_size` acts only on blocks and requests at least
    ///   that large (`should_split` and `get_free_block` compare them with it,
    ///   `release_available_cached_blocks` frees only such blocks and frees nothing without one,
    ///   `max_non_split_rounding` applies to such requests, and the oversize statistics count
    ///   them). Without expandable segments a block is a piece of one segment, and the largest
    ///   segment is the one made for the largest request (`get_allocation_size(round_size(...))`),
    ///   whatever the capacity.
    /// - **`roundup_power2_divisions`**, where both round every request of at most
    ///   `largest_request` bytes to the next multiple of 512. It is read in `round_size` alone,
    ///   which rounds to a power-of-two division only a request above `512 * divisions` bytes
    ///   whose interval has more than one division ([`AllocatorConfig::rounds_plainly_up_to`]).
    ///   Every block, segment and decision follows from the rounded sizes.
    pub fn same_run(&self, other: &AllocatorConfig, largest_request: u64) -> Option<SameRun> {
        let knobs_off = |c: &AllocatorConfig| AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: 0,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            ..c.clone()
        };
        if knobs_off(self) != knobs_off(other) || self == other {
            return None;
        }
        let split_differs =
            (self.max_split_size, self.max_non_split_rounding) != (other.max_split_size, other.max_non_split_rounding);
        let rounding_differs = self.roundup_power2_divisions != other.roundup_power2_divisions;
        if rounding_differs
            && !(self.rounds_plainly_up_to(largest_request) && other.rounds_plainly_up_to(largest_request))
        {
            return None;
        }
        if split_differs {
            // Both round the stream's requests alike here, so their largest segment is one.
            let largest_segment =
                super::rounding::allocation_size(self, super::rounding::round_size(self, largest_request));
            let below = |split: Option<u64>| split.is_none_or(|m| largest_segment < m);
            if self.expandable_segments || !(below(self.max_split_size) && below(other.max_split_size)) {
                return None;
            }
        }
        Some(match (split_differs, rounding_differs) {
            (true, true) => SameRun::Both,
            (true, false) => SameRun::SplitUnreached,
            _ => SameRun::RoundedAlike,
        })
    }

    /// True when `round_size` rounds every request of at most `largest` bytes to the next
    /// multiple of 512 under these settings: in each interval of `roundup_power2_divisions`
    /// that such a request can fall in, the divisions are at most 1, or no such request of the
    /// interval is above `512 * divisions` bytes.
    pub fn rounds_plainly_up_to(&self, largest: u64) -> bool {
        (0..ROUNDUP_INTERVALS).all(|idx| {
            let d = u64::from(self.roundup_power2_divisions[idx]);
            // Interval `idx` holds the sizes whose `floor(log2)` is `idx + 20`; the first holds
            // every smaller size too, the last every larger one.
            let low = if idx == 0 { 1 } else { 1u64 << (idx + 20) };
            let high = if idx == ROUNDUP_INTERVALS - 1 { u64::MAX } else { (1u64 << (idx + 21)) - 1 };
            let top = high.min(largest);
            d <= 1 || top < low || top <= MIN_BLOCK_SIZE.saturating_mul(d)
        })
    }

    /// The first key that is no PyTorch allocator setting (PyTorch refuses such a string; the
    /// parser keeps it so that foreign traces still load, and a user's own setting should be
    /// checked with this).
    pub fn unknown_key(&self) -> Option<&str> {
        self.other.iter().map(|(k, _)| k.as_str()).find(|k| !UNMODELLED_KEYS.contains(k) && !MODELLED_KEYS.contains(k))
    }

    /// `throw_on_cudamalloc_oom:True` (PyTorch 2.12 and later; see
    /// [`super::version::TorchVersion::preempts_fraction_oom`]).
    pub fn throw_on_cudamalloc_oom(&self) -> bool {
        self.other
            .iter()
            .rev()
            .find(|(k, _)| k == "throw_on_cudamalloc_oom")
            .is_some_and(|(_, v)| parse_bool(v) == Some(true))
    }

    /// `per_process_memory_fraction:F` (PyTorch 2.10 and later): the capacity is `F` times the
    /// device's total memory ([`super::version::TorchVersion::fraction_cap`]); 1 sets none.
    pub fn memory_fraction(&self) -> Option<f64> {
        self.other.iter().rev().find(|(k, _)| k == "per_process_memory_fraction").and_then(|(_, v)| v.parse().ok())
    }

    /// The address range each new expandable segment reserves on a device of `total` bytes
    /// under `expandable_segments_reserve` (PyTorch 2.13 and later): a fraction of `total`
    /// (`0.5`) or whole GiB (`40G`), capped at PyTorch's full reserve of `total + total / 8`.
    /// `None` when the key is absent or its value malformed or not positive (PyTorch warns and
    /// keeps the full reserve).
    pub fn expandable_segments_reserve(&self, total: u64) -> Option<u64> {
        let (_, v) = self.other.iter().rev().find(|(k, _)| k == "expandable_segments_reserve")?;
        let v = v.trim();
        let (num, gib) = match v.strip_suffix(['G', 'g']) {
            Some(n) => (n, true),
            None => (v, false),
        };
        let value: f64 = num.parse().ok().filter(|x: &f64| x.is_finite() && *x > 0.0)?;
        let bytes = if gib { value * (1u64 << 30) as f64 } else { value * total as f64 };
        let full = total.saturating_add(total / 8);
        Some(if bytes >= full as f64 { full } else { bytes as u64 })
    }

    /// What is wrong with the keys of settings a user gave, as PyTorch would see it: a key it
    /// does not know (a typo would otherwise change nothing, silently), with the nearest known
    /// one.
    pub fn check_user_keys(&self) -> Result<(), String> {
        if let Some(key) = self.unknown_key() {
            let known = MODELLED_KEYS.iter().chain(UNMODELLED_KEYS.iter());
            let nearest =
                known.min_by_key(|k| strsim::levenshtein(k, key)).filter(|k| strsim::levenshtein(k, key) <= 3);
            return Err(match nearest {
                Some(k) => format!("`{key}` is not an allocator setting; did you mean `{k}`?"),
                None => format!("`{key}` is not an allocator setting (settings: {})", MODELLED_KEYS.join(", ")),
            });
        }
        Ok(())
    }
}

/// Parses allocator settings a user gave (`--conf`, or `PYTORCH_CUDA_ALLOC_CONF` for `record`),
/// refusing what [`AllocatorConfig::check_user_keys`] finds.
pub fn user_conf(s: &str) -> Result<AllocatorConfig, String> {
    let c = AllocatorConfig::parse(s).map_err(|e| e.reason)?;
    c.check_user_keys()?;
    Ok(c)
}

/// A configuration string that cannot be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid allocator configuration `{conf}`: {reason}")]
pub struct ConfError {
    pub conf: String,
    pub reason: String,
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF`-style string. The empty string is the default.
    pub fn parse(conf: &str) -> Result<Self, ConfError> {
        let err = |reason: String| ConfError { conf: conf.to_string(), reason };
        let mut c = AllocatorConfig::default();
        for item in split_top_level(conf) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (key, value) = item.split_once(':').ok_or_else(|| err(format!("`{item}` is not `key:value`")))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "max_split_size_mb" => {
                    let mb =
                        parse_u64(value).ok_or_else(|| err(format!("max_split_size_mb `{value}` is not a number")))?;
                    if mb <= LARGE_BUFFER / MIB {
                        return Err(err(format!("max_split_size_mb must be > {} (got {mb})", LARGE_BUFFER / MIB)));
                    }
                    c.max_split_size = Some(
                        mb.checked_mul(MIB).ok_or_else(|| err(format!("max_split_size_mb {mb} is out of range")))?,
                    );
                }
                "max_non_split_rounding_mb" => {
                    let mb = parse_u64(value)
                        .ok_or_else(|| err(format!("max_non_split_rounding_mb `{value}` is not a number")))?;
                    c.max_non_split_rounding = mb
                        .checked_mul(MIB)
                        .ok_or_else(|| err(format!("max_non_split_rounding_mb {mb} is out of range")))?;
                }
                "large_segment_size_mb" => {
                    let mb = parse_u64(value)
                        .ok_or_else(|| err(format!("large_segment_size_mb `{value}` is not a number")))?;
                    if mb <= MIN_LARGE_ALLOC / MIB {
                        return Err(err(format!(
                            "large_segment_size_mb must be > {} (got {mb})",
                            MIN_LARGE_ALLOC / MIB
                        )));
                    }
                    c.large_segment_size = mb
                        .checked_mul(MIB)
                        .ok_or_else(|| err(format!("large_segment_size_mb {mb} is out of range")))?;
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| err(format!("garbage_collection_threshold `{value}` is not a number")))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(err(format!("garbage_collection_threshold must be in (0, 1) (got {value})")));
                    }
                    c.garbage_collection_threshold = Some(t);
                }
                "expandable_segments" => {
                    c.expandable_segments = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(err(format!("expandable_segments must be True or False (got `{value}`)"))),
                    }
                }
                "roundup_power2_divisions" => {
                    c.roundup_power2_divisions = parse_divisions(value).map_err(err)?;
                }
                "backend" => {
                    if value != "native" {
                        return Err(err(format!(
                            "backend `{value}` is not modelled; only the native caching allocator is"
                        )));
                    }
                }
                "throw_on_cudamalloc_oom" => {
                    if parse_bool(value).is_none() {
                        return Err(err(format!("throw_on_cudamalloc_oom must be True or False (got `{value}`)")));
                    }
                    c.other.push((key.to_string(), value.to_string()));
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value
                        .parse()
                        .map_err(|_| err(format!("per_process_memory_fraction `{value}` is not a number")))?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(err(format!("per_process_memory_fraction must be in [0, 1] (got {value})")));
                    }
                    c.other.push((key.to_string(), value.to_string()));
                }
                _ => c.other.push((key.to_string(), value.to_string())),
            }
        }
        Ok(c)
    }

    /// Checks settings that did not come from [`AllocatorConfig::parse`] (a trace header) exactly
    /// as a command line's are checked: they must be what parsing their own
    /// `PYTORCH_CUDA_ALLOC_CONF` string gives. A hand-made `large_segment_size` of 0, a
    /// threshold outside (0, 1) or divisions that are not powers of two are refused with
    /// parse's own message, so the engine never sees them.
    pub fn check(&self) -> Result<(), String> {
        let text = self.to_string();
        let parsed = AllocatorConfig::parse(&text).map_err(|e| e.reason)?;
        if parsed != *self {
            return Err(format!(
                "the settings are not what their own configuration string `{text}` gives (sizes must be whole MiB)"
            ));
        }
        Ok(())
    }

    /// The divisions used for a request of `bytes` (interval `floor(log2 bytes) - 20`, clamped).
    pub fn divisions_for(&self, bytes: u64) -> u32 {
        let log2 = 63 - bytes.max(1).leading_zeros() as i64;
        let idx = (log2 - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }
}

/// Why two settings are one run on a request stream ([`AllocatorConfig::same_run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameRun {
    /// They differ in the split size, and no segment of the stream reaches it.
    SplitUnreached,
    /// They differ in `roundup_power2_divisions`, and both round every request to a multiple of
    /// 512 bytes.
    RoundedAlike,
    /// Both of the above.
    Both,
}

impl SameRun {
    /// Why, in the words every output uses.
    pub fn why(self) -> &'static str {
        match self {
            SameRun::SplitUnreached => "no segment reaches the split size",
            SameRun::RoundedAlike => "no request is large enough for the power-of-two divisions to round it",
            SameRun::Both => {
                "no segment reaches the split size, and no request is large enough for the \
                 power-of-two divisions to round it"
            }
        }
    }
}

/// Splits on commas that are not inside `[...]`.
pub(crate) fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, ch) in s.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// PyTorch's `ConfigTokenizer::toBool`: `True`/`true` or `False`/`false`.
fn parse_bool(s: &str) -> Option<bool> {
    match s.trim() {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        _ => None,
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    s.trim().parse().ok()
}

fn check_pow2(v: u64, what: &str) -> Result<(), String> {
    if v == 0 || v.is_power_of_two() {
        Ok(())
    } else {
        Err(format!("{what} {v} is not a power of two"))
    }
}

/// `N` (all intervals) or `[K1:v1,K2:v2,>:vN]` with K in MiB. PyTorch's code semantics: key K
/// sets interval `log2(K)`, i.e. `[K, 2K)` MiB; the first key also fills every interval below
/// it; `>` fills every interval after the last key.
fn parse_divisions(value: &str) -> Result<[u32; ROUNDUP_INTERVALS], String> {
    let mut table = [0u32; ROUNDUP_INTERVALS];
    let value = value.trim();
    if let Some(inner) = value.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or("roundup_power2_divisions: missing `]`")?;
        let mut last: Option<usize> = None;
        let mut first = true;
        for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) =
                part.split_once(':').ok_or_else(|| format!("roundup_power2_divisions: `{part}` is not `K:v`"))?;
            let v: u64 = v.trim().parse().map_err(|_| format!("roundup_power2_divisions: `{v}` is not a number"))?;
            check_pow2(v, "roundup_power2_divisions value")?;
            if k.trim() == ">" {
                let from = last.map_or(0, |l| l + 1);
                for e in table.iter_mut().skip(from) {
                    *e = v as u32;
                }
                continue;
            }
            let k: u64 =
                k.trim().parse().map_err(|_| format!("roundup_power2_divisions: key `{k}` is not a number"))?;
            if k == 0 || !k.is_power_of_two() {
                return Err(format!("roundup_power2_divisions key {k} is not a power of two"));
            }
            let idx = (63 - k.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                for e in table.iter_mut().take(idx) {
                    *e = v as u32;
                }
                first = false;
            }
            table[idx] = v as u32;
            last = Some(idx);
        }
        Ok(table)
    } else {
        let v: u64 = value.parse().map_err(|_| format!("roundup_power2_divisions `{value}` is not a number"))?;
        check_pow2(v, "roundup_power2_divisions")?;
        Ok([v as u32; ROUNDUP_INTERVALS])
    }
}

impl fmt::Display for AllocatorConfig {
    /// The canonical `PYTORCH_CUDA_ALLOC_CONF` string; empty for the default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != LARGE_BUFFER {
            parts.push(format!("max_non_split_rounding_mb:{}", self.max_non_split_rounding / MIB));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().any(|&v| v != 0) {
            if d.iter().all(|&v| v == d[0]) {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            } else {
                let items: Vec<String> = d.iter().enumerate().map(|(i, v)| format!("{}:{}", 1u64 << i, v)).collect();
                parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
            }
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.large_segment_size != LARGE_BUFFER {
            parts.push(format!("large_segment_size_mb:{}", self.large_segment_size / MIB));
        }
        for (k, v) in &self.other {
            parts.push(format!("{k}:{v}"));
        }
        f.write_str(&parts.join(","))
    }
}

/// Parses a byte quantity: plain bytes, or a number with a unit. Binary units (KiB, MiB, GiB,
/// TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) powers of 1000; `K`/`M`/`G`/`T`
/// alone are binary, as in PyTorch's settings.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (use bytes, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")),
    };
    let value: f64 = num.parse().map_err(|_| format!("`{text}` is not a byte quantity (e.g. 6GiB, 1.5GB, 512MiB)"))?;
    if mult == 1.0 && value.fract() != 0.0 {
        return Err(format!("`{text}`: a number without a unit is bytes, which are whole; give a unit (e.g. {t}GiB)"));
    }
    let bytes = value * mult;
    // `u64::MAX as f64` rounds up to 2^64, which does not fit.
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `max_split_size_mb:512` changes nothing where every segment is below 512 MiB (a 400 MiB
    /// request gets a 400 MiB segment), and does where a request's segment reaches it; other
    /// knobs, and expandable segments (one segment grows past any request), are never the same.
    #[test]
    fn a_split_size_above_every_segment_is_the_same_run() {
        let cfg = |s: &str| AllocatorConfig::parse(s).unwrap();
        let (default, m512, m64) = (cfg(""), cfg("max_split_size_mb:512"), cfg("max_split_size_mb:64"));
        assert!(default.same_run_as(&m512, 400 * MIB));
        assert!(m512.same_run_as(&default, 400 * MIB));
        assert!(!default.same_run_as(&m512, 512 * MIB));
        assert!(!default.same_run_as(&m512, 511 * MIB + 1));
        assert!(!default.same_run_as(&m64, 400 * MIB));
        assert!(m512.same_run_as(&cfg("max_split_size_mb:512,max_non_split_rounding_mb:64"), 100 * MIB));
        assert!(!default.same_run_as(&cfg("roundup_power2_divisions:4"), MIB));
        assert!(!default.same_run_as(&cfg("garbage_collection_threshold:0.6"), MIB));
        let e = cfg("expandable_segments:True");
        assert!(!e.same_run_as(&cfg("expandable_segments:True,max_split_size_mb:512"), MIB));
        // Requests near 2^64 saturate: never below a split size.
        assert!(!default.same_run_as(&m512, u64::MAX));
    }

    /// `roundup_power2_divisions:N` rounds a request above `512 * N` bytes to a division of
    /// its power-of-two interval, and below that to a multiple of 512, as the default does; the
    /// table form applies each interval's own divisions.
    #[test]
    fn divisions_no_request_reaches_are_the_same_run() {
        let cfg = |s: &str| AllocatorConfig::parse(s).unwrap();
        let (default, r4, r8) = (cfg(""), cfg("roundup_power2_divisions:4"), cfg("roundup_power2_divisions:8"));
        assert_eq!(default.same_run(&r4, 2048), Some(SameRun::RoundedAlike));
        assert_eq!(r4.same_run(&r8, 2048), Some(SameRun::RoundedAlike));
        assert_eq!(default.same_run(&r4, 2049), None);
        assert_eq!(default.same_run(&r8, 4096), Some(SameRun::RoundedAlike));
        assert_eq!(default.same_run(&r8, 4097), None);
        // What the rule stands on: every request up to the bound rounds alike.
        for bytes in (1..=4096u64).chain([2049, 3000, 4097, 5000]) {
            let alike =
                super::super::rounding::round_size(&default, bytes) == super::super::rounding::round_size(&r8, bytes);
            assert!(bytes > 4096 || alike, "{bytes}");
        }
        // The rule is enough, not necessary: 4097 B rounds to 4608 B both ways (a division of
        // 4 KiB in 8 is 512 B), and 8193 B is the first request that rounds otherwise.
        assert_eq!(super::super::rounding::round_size(&r8, 4097), 4608);
        assert_ne!(super::super::rounding::round_size(&default, 8193), super::super::rounding::round_size(&r8, 8193));
        // Divisions only from 2 MiB up: every request below 2 MiB is rounded plainly.
        let t = cfg("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
        assert!(t.rounds_plainly_up_to(MIB) && t.rounds_plainly_up_to(2 * MIB - 1));
        assert!(!t.rounds_plainly_up_to(1024 * MIB));
        assert!(cfg("roundup_power2_divisions:[>:1]").rounds_plainly_up_to(u64::MAX));
        // A split size and the divisions at once.
        assert_eq!(
            default.same_run(&cfg("max_split_size_mb:512,roundup_power2_divisions:4"), 2048),
            Some(SameRun::Both)
        );
        // Another knob is never the same run.
        assert_eq!(r4.same_run(&cfg("roundup_power2_divisions:4,garbage_collection_threshold:0.6"), 512), None);
    }

    #[test]
    fn default_is_empty_string() {
        let c = AllocatorConfig::parse("").unwrap();
        assert_eq!(c, AllocatorConfig::default());
        assert_eq!(c.to_string(), "");
    }

    #[test]
    fn parses_every_knob_and_round_trips() {
        let s =
            "max_split_size_mb:64,roundup_power2_divisions:4,garbage_collection_threshold:0.6,expandable_segments:True";
        let c = AllocatorConfig::parse(s).unwrap();
        assert_eq!(c.max_split_size, Some(64 * MIB));
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.garbage_collection_threshold, Some(0.6));
        assert!(c.expandable_segments);
        assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn divisions_list_uses_code_semantics() {
        // Key K covers [K, 2K) MiB; the first key fills below it; `>` fills after the last.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let t = c.roundup_power2_divisions;
        assert_eq!(&t[..8], &[1; 8]);
        assert_eq!(t[8], 1); // 256..512 MiB
        assert_eq!(t[9], 2); // 512 MiB..1 GiB
        assert_eq!(t[10], 4); // 1..2 GiB
        assert_eq!(&t[11..], &[8; 5]); // >= 2 GiB
        assert_eq!(c.divisions_for(300 * MIB), 1);
        assert_eq!(c.divisions_for(600 * MIB), 2);
        assert_eq!(c.divisions_for(3 << 30), 8);
    }

    #[test]
    fn rejects_bad_values_with_reason() {
        for bad in [
            "max_split_size_mb:10",
            "max_split_size_mb:x",
            "garbage_collection_threshold:1.5",
            "expandable_segments:maybe",
            "roundup_power2_divisions:3",
            "nonsense",
            "backend:cudaMallocAsync",
        ] {
            let e = AllocatorConfig::parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    /// `ExpandableSegmentReserveSpec::resolveBytes` and `clamp_reserve_bytes`: a fraction of
    /// the device or whole GiB, never more than `total + total / 8`; a bad value keeps the
    /// full reserve.
    #[test]
    fn expandable_segments_reserve_is_a_fraction_or_gib_capped_at_the_full_reserve() {
        let total = 80u64 << 30;
        let reserve = |v: &str| {
            AllocatorConfig::parse(&format!("expandable_segments:True,expandable_segments_reserve:{v}"))
                .unwrap()
                .expandable_segments_reserve(total)
        };
        assert_eq!(reserve("0.5"), Some(40 << 30));
        assert_eq!(reserve("40G"), Some(40 << 30));
        assert_eq!(reserve("2"), Some(total + total / 8));
        assert_eq!(reserve("1e20G"), Some(total + total / 8));
        for bad in ["0", "-1", "x", "G", "inf"] {
            assert_eq!(reserve(bad), None, "{bad}");
        }
        assert_eq!(AllocatorConfig::default().expandable_segments_reserve(total), None);
    }

    #[test]
    fn keeps_unknown_keys() {
        let c = AllocatorConfig::parse("pinned_num_register_threads:8,expandable_segments:False").unwrap();
        assert_eq!(c.other, vec![("pinned_num_register_threads".to_string(), "8".to_string())]);
        assert_eq!(c.to_string(), "pinned_num_register_threads:8");
        assert_eq!(c.unknown_key(), None, "a PyTorch setting the engine does not act on");
        let typo = AllocatorConfig::parse("pinned_num_register_threads:8,expandable_segment:True").unwrap();
        assert_eq!(typo.unknown_key(), Some("expandable_segment"));
        assert_eq!(AllocatorConfig::parse("backend:native").unwrap(), AllocatorConfig::default());
        assert!(!typo.expandable_segments);
    }
}
