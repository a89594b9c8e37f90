//! Which PyTorch release's allocator the engine follows, and what changed between releases.
//!
//! The core policy (rounding, pools, best fit, split, merge, the order of the out-of-memory
//! path) is the same from 2.9 to 2.13. What differs, as PyTorch's source has it:
//!
//! | release | change | engine |
//! |---|---|---|
//! | 2.9 | `PYTORCH_ALLOC_CONF` is read first; `PYTORCH_CUDA_ALLOC_CONF` only when it is unset (for the CUDA-only keys, the other way round) | [`resolve_conf_env`] |
//! | 2.10 | the key `per_process_memory_fraction` | a capacity of `fraction x device total` |
//! | 2.11 | the key `large_segment_size_mb` | parsed by the configuration |
//! | 2.12 | the key `throw_on_cudamalloc_oom`: with a memory fraction, a device allocation that would pass the cap throws at once, skipping the release of cached blocks and the retry | [`TorchVersion::preempts_fraction_oom`] |
//! | 2.13 | the fraction cap `fraction x total` is rounded to the nearest byte, no longer truncated | [`TorchVersion::fraction_cap`] |
//! | 2.13 | the key `expandable_segments_reserve`: the address range a new expandable segment reserves (default `total + total / 8`); a stream whose mapped pages outgrow it starts another segment, and blocks never merge across segments | [`TorchVersion::reserves_expandable_by_setting`] (`_by_class` names classes that code assigns to streams: kept verbatim) |
//!
//! A trace whose header names no release is replayed as [`TorchVersion::MODELLED`], the release
//! the engine was checked against on a GPU.
//!
//! How each row was checked: 2.11 against real runs on an H100 (the truth table). The 2.12 and
//! 2.13 rows, the environment order of 2.9 and the key table were read from PyTorch's source
//! (`CUDAAllocatorConfig`, `AcceleratorAllocatorConfig`) and pull requests (#177356, #179057,
//! #179473, #179444), not yet against a real 2.12 or 2.13 run. Where a rule's exact place was
//! not in the source read, the pull request's description was followed: the 2.12 rejection
//! happens at the first device allocation of a `malloc`, after garbage collection and before any
//! release of cached blocks.

use std::fmt;

/// A PyTorch release, by major and minor number (`2.12`); patch releases do not change the
/// allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion {
    pub major: u16,
    pub minor: u16,
}

/// A key of the allocator settings that a PyTorch release does not know: PyTorch refuses such a
/// string ("Unrecognized key").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{key}` is a setting of PyTorch {since} and later; PyTorch {version} refuses it")]
pub struct KeyTooNew {
    pub key: String,
    pub since: TorchVersion,
    pub version: TorchVersion,
}

/// Allocator keys that appeared after 2.8, with the release that introduced each.
pub const KEYS_SINCE: [(&str, TorchVersion); 5] = [
    ("per_process_memory_fraction", TorchVersion::new(2, 10)),
    ("large_segment_size_mb", TorchVersion::new(2, 11)),
    ("throw_on_cudamalloc_oom", TorchVersion::new(2, 12)),
    ("expandable_segments_reserve", TorchVersion::new(2, 13)),
    ("expandable_segments_reserve_by_class", TorchVersion::new(2, 13)),
];

impl TorchVersion {
    /// The release the engine was checked against on a GPU, and the one a trace that names no
    /// release is replayed as.
    pub const MODELLED: TorchVersion = TorchVersion::new(2, 11);

    pub const fn new(major: u16, minor: u16) -> Self {
        TorchVersion { major, minor }
    }

    /// Parses `2.12`, `2.12.0`, `2.13.0+cu130` or `2.13.0a0+git1234` (what `torch.__version__`
    /// prints): the major and minor numbers.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let bad = || format!("`{text}` is not a PyTorch version (e.g. 2.12 or 2.13.0+cu130)");
        let mut parts = t.split('.');
        let major = parts.next().and_then(|p| p.parse::<u16>().ok()).ok_or_else(bad)?;
        let minor_text = parts.next().ok_or_else(bad)?;
        let digits = minor_text.find(|c: char| !c.is_ascii_digit()).unwrap_or(minor_text.len());
        let minor = minor_text[..digits].parse::<u16>().map_err(|_| bad())?;
        if major == 0 {
            return Err(bad());
        }
        Ok(TorchVersion { major, minor })
    }

    /// The release named by a trace header's field (empty = none).
    pub fn from_header(text: &str) -> Option<Self> {
        if text.is_empty() {
            None
        } else {
            TorchVersion::parse(text).ok()
        }
    }

    /// 2.12 and later: with `throw_on_cudamalloc_oom:True` and a memory fraction, a device
    /// allocation that would take reserved memory past the cap throws at once (PRs #177356,
    /// #179057, #179473), instead of freeing cached blocks and retrying.
    pub fn preempts_fraction_oom(self) -> bool {
        self >= TorchVersion::new(2, 12)
    }

    /// 2.13 and later round `fraction x total` to the nearest byte (PR #179444); earlier
    /// releases truncate it, which can leave the cap one byte short.
    pub fn rounds_fraction_cap(self) -> bool {
        self >= TorchVersion::new(2, 13)
    }

    /// 2.13 and later size a new expandable segment's address range by
    /// `expandable_segments_reserve` when it is set.
    pub fn reserves_expandable_by_setting(self) -> bool {
        self >= TorchVersion::new(2, 13)
    }

    /// 2.9 and later read `PYTORCH_ALLOC_CONF`; earlier ones only `PYTORCH_CUDA_ALLOC_CONF`.
    pub fn reads_alloc_conf(self) -> bool {
        self >= TorchVersion::new(2, 9)
    }

    /// `allowed_memory_maximum` for `set_per_process_memory_fraction(fraction)` on a device of
    /// `total` bytes, as this release computes it. A fraction of 1 or more sets no cap.
    pub fn fraction_cap(self, fraction: f64, total: u64) -> Option<u64> {
        if !(0.0..1.0).contains(&fraction) {
            return None;
        }
        let exact = fraction * total as f64;
        Some(if self.rounds_fraction_cap() { exact.round() as u64 } else { exact as u64 })
    }

    /// Whether this release knows the allocator key `key`.
    pub fn check_key(self, key: &str) -> Result<(), KeyTooNew> {
        match KEYS_SINCE.iter().find(|(k, _)| *k == key) {
            Some(&(_, since)) if self < since => Err(KeyTooNew { key: key.to_string(), since, version: self }),
            _ => Ok(()),
        }
    }
}

impl Default for TorchVersion {
    fn default() -> Self {
        TorchVersion::MODELLED
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for TorchVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        TorchVersion::parse(s)
    }
}

/// Keys PyTorch reads from `CUDAAllocatorConfig` (the CUDA-specific settings) rather than from
/// the device-generic `AcceleratorAllocatorConfig`.
pub const CUDA_ONLY_KEYS: [&str; 13] = [
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
    "pinned_free_catch_all",
    "throw_on_cudamalloc_oom",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
];

/// The allocator settings a PyTorch release runs under, given its two environment variables
/// (`None` = unset), as one `key:value,...` string.
///
/// From 2.9 PyTorch parses the environment twice. The device-generic settings (max_split_size_mb,
/// roundup_power2_divisions, garbage_collection_threshold, expandable_segments, ...) come from
/// `PYTORCH_ALLOC_CONF` when it is set, and from `PYTORCH_CUDA_ALLOC_CONF` only when it is not
/// (`AcceleratorAllocatorConfig::instance`, which warns that the older name is deprecated). The
/// CUDA-specific settings ([`CUDA_ONLY_KEYS`]) are read the other way round: from
/// `PYTORCH_CUDA_ALLOC_CONF` when it is set, else from `PYTORCH_ALLOC_CONF`
/// (`CUDAAllocatorConfig::instance`). The variable not chosen is not read at all. Before 2.9 only
/// `PYTORCH_CUDA_ALLOC_CONF` exists.
pub fn resolve_conf_env(version: TorchVersion, alloc_conf: Option<&str>, cuda_alloc_conf: Option<&str>) -> String {
    if !version.reads_alloc_conf() {
        return cuda_alloc_conf.unwrap_or_default().to_string();
    }
    let generic_from = alloc_conf.or(cuda_alloc_conf).unwrap_or_default();
    let cuda_from = cuda_alloc_conf.or(alloc_conf).unwrap_or_default();
    if generic_from == cuda_from {
        return generic_from.to_string();
    }
    let is_cuda = |item: &str| {
        let key = item.split_once(':').map_or(item, |(k, _)| k).trim();
        CUDA_ONLY_KEYS.contains(&key)
    };
    let mut out: Vec<&str> = Vec::new();
    out.extend(
        super::config::split_top_level(generic_from).into_iter().filter(|i| !i.trim().is_empty() && !is_cuda(i)),
    );
    out.extend(super::config::split_top_level(cuda_from).into_iter().filter(|i| !i.trim().is_empty() && is_cuda(i)));
    out.iter().map(|s| s.trim()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_torch_version_prints() {
        assert_eq!(TorchVersion::parse("2.12").unwrap(), TorchVersion::new(2, 12));
        assert_eq!(TorchVersion::parse("2.13.0+cu130").unwrap(), TorchVersion::new(2, 13));
        assert_eq!(TorchVersion::parse("2.14.0a0+gitabc").unwrap(), TorchVersion::new(2, 14));
        assert_eq!(TorchVersion::parse("2.9.1").unwrap().to_string(), "2.9");
        for bad in ["", "2", "x.1", "2.x", "0.4"] {
            assert!(TorchVersion::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(TorchVersion::from_header(""), None);
        assert_eq!(TorchVersion::default(), TorchVersion::MODELLED);
    }

    /// PR #179444: `fraction * total` was truncated to size_t, which can land one byte short of
    /// the intended cap; 2.13 rounds before the cast.
    #[test]
    fn the_fraction_cap_is_truncated_before_2_13_and_rounded_from_it() {
        // A user who wants a 4 GiB cap on an H100 sets fraction = 4 GiB / totalGlobalMem; the
        // product lands just below 4 GiB.
        let total = 85_045_510_144u64;
        let wanted = 4u64 << 30;
        let f = wanted as f64 / total as f64;
        assert!(f * (total as f64) < wanted as f64);
        assert_eq!(TorchVersion::new(2, 12).fraction_cap(f, total), Some(wanted - 1));
        assert_eq!(TorchVersion::new(2, 13).fraction_cap(f, total), Some(wanted));
        assert_eq!(TorchVersion::new(2, 13).fraction_cap(1.0, total), None, "a fraction of 1 sets no cap");
    }

    #[test]
    fn keys_are_known_from_their_release() {
        let v211 = TorchVersion::new(2, 11);
        assert!(v211.check_key("max_split_size_mb").is_ok());
        assert!(v211.check_key("large_segment_size_mb").is_ok());
        let e = v211.check_key("throw_on_cudamalloc_oom").unwrap_err();
        assert_eq!(e.since, TorchVersion::new(2, 12));
        assert!(e.to_string().contains("PyTorch 2.12 and later"), "{e}");
        assert!(TorchVersion::new(2, 12).check_key("throw_on_cudamalloc_oom").is_ok());
        assert!(TorchVersion::new(2, 12).check_key("expandable_segments_reserve").is_err());
    }

    /// `AcceleratorAllocatorConfig::instance` parses the first of PYTORCH_ALLOC_CONF,
    /// PYTORCH_CUDA_ALLOC_CONF that is set; `CUDAAllocatorConfig::instance` the first of
    /// PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF.
    #[test]
    fn the_newer_variable_wins_for_the_generic_settings_and_the_older_for_the_cuda_ones() {
        let v = TorchVersion::new(2, 12);
        assert_eq!(resolve_conf_env(v, None, None), "");
        assert_eq!(resolve_conf_env(v, Some("expandable_segments:True"), None), "expandable_segments:True");
        assert_eq!(resolve_conf_env(v, None, Some("max_split_size_mb:64")), "max_split_size_mb:64");
        let both = resolve_conf_env(
            v,
            Some("expandable_segments:True,per_process_memory_fraction:0.5"),
            Some("max_split_size_mb:64,throw_on_cudamalloc_oom:True"),
        );
        assert_eq!(both, "expandable_segments:True,throw_on_cudamalloc_oom:True");
        // Before 2.9 the newer name does not exist.
        assert_eq!(
            resolve_conf_env(TorchVersion::new(2, 8), Some("expandable_segments:True"), Some("max_split_size_mb:64")),
            "max_split_size_mb:64"
        );
        // A bracketed list stays whole.
        assert_eq!(
            resolve_conf_env(v, Some("roundup_power2_divisions:[256:1,>:4]"), Some("release_lock_on_cudamalloc:True")),
            "roundup_power2_divisions:[256:1,>:4],release_lock_on_cudamalloc:True"
        );
    }
}
