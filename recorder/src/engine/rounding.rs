//! Size rounding, segment sizes and pool choice (PyTorch `round_size`, `get_allocation_size`,
//! `get_pool`).
//!
//! Worked example, default configuration:
//! ```text
//! request          round_size        pool    allocation_size (segment)
//! 1 byte           512               small   2 MiB
//! 1 MiB            1 MiB             small   2 MiB      (exactly 1 MiB is still small)
//! 1 MiB + 1        1 MiB + 512       large   20 MiB
//! 10 MiB + 1       10 MiB + 512      large   12 MiB     (>= 10 MiB: round up to 2 MiB)
//! ```
//! With `roundup_power2_divisions:4`, 1200 bytes is above `512 * 4`? No (2048), so it is plain
//! 512-rounding: 1536. 1200 *MiB* rounds to 1280 MiB (interval 1024 MiB split in 4 steps of 256).

use super::config::{AllocatorConfig, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE};
use crate::trace::Pool;

/// The block size handed out for a request of `bytes` (PyTorch `round_size`).
pub fn round_size(config: &AllocatorConfig, bytes: u64) -> u64 {
    let divisions = config.divisions_for(bytes) as u64;
    if divisions > 1 && bytes > MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(bytes, divisions)
    } else {
        round_plain(bytes)
    }
}

/// `round_size` without `roundup_power2_divisions`: the next multiple of 512, at least 512
/// (saturating: a request that large fails anyway).
#[inline]
pub fn round_plain(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
}

/// Rounds `bytes` up to the next of `divisions` equal steps between the powers of two around it.
pub fn roundup_power2_next_division(bytes: u64, divisions: u64) -> u64 {
    if bytes.is_power_of_two() {
        return bytes;
    }
    let floor_pow2 = 1u64 << (63 - bytes.leading_zeros());
    let step = floor_pow2 >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor_pow2 << 1;
    }
    let low = bytes & !(step - 1);
    if low == bytes {
        bytes
    } else {
        low.saturating_add(step)
    }
}

/// The segment size obtained from the device for a rounded request (`get_allocation_size`).
pub fn allocation_size(config: &AllocatorConfig, rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        // Saturates near u64::MAX (a request no device can serve) instead of wrapping to 0.
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// The pool serving a rounded request: at most 1 MiB is small.
pub fn pool_for(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The expandable-segment page size of a pool.
pub fn page_size(config: &AllocatorConfig, pool: Pool) -> u64 {
    match pool {
        Pool::Small => SMALL_BUFFER,
        Pool::Large => config.large_segment_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::MIB;

    fn cfg(s: &str) -> AllocatorConfig {
        AllocatorConfig::parse(s).unwrap()
    }

    /// Requests near u64::MAX (a `malloc(SIZE_MAX)` through the C ABI, a damaged trace) round
    /// to sizes no device has, never wrap to small ones or overflow.
    #[test]
    fn huge_requests_saturate() {
        for c in [AllocatorConfig::default(), cfg("roundup_power2_divisions:4"), cfg("expandable_segments:True")] {
            for bytes in [u64::MAX, u64::MAX - 511, (1 << 63) + 1, 1 << 63] {
                let r = round_size(&c, bytes);
                assert!(r >= bytes.min(u64::MAX - 511), "{bytes} -> {r}");
                assert!(allocation_size(&c, r) >= r, "{bytes} -> {r} -> {}", allocation_size(&c, r));
            }
        }
    }

    #[test]
    fn plain_rounding_to_512() {
        let c = AllocatorConfig::default();
        assert_eq!(round_size(&c, 0), 512);
        assert_eq!(round_size(&c, 1), 512);
        assert_eq!(round_size(&c, 512), 512);
        assert_eq!(round_size(&c, 513), 1024);
        assert_eq!(round_size(&c, 1200), 1536);
        assert_eq!(round_size(&c, 10 * MIB + 1), 10 * MIB + 512);
    }

    #[test]
    fn power2_divisions_reference_example() {
        // The reference: 1200 with d=4 -> f=1024, step=256 -> 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
        assert_eq!(roundup_power2_next_division(1280, 4), 1280);
        assert_eq!(roundup_power2_next_division(1281, 4), 1536);
        // step 0 (divisions larger than the power of two) -> next power of two
        assert_eq!(roundup_power2_next_division(3, 8), 4);
        let c4 = cfg("roundup_power2_divisions:4");
        // Only applies above 512 * d bytes.
        assert_eq!(round_size(&c4, 1200), 1536);
        assert_eq!(round_size(&c4, 2049), 2560);
        assert_eq!(round_size(&c4, 1200 * MIB), 1280 * MIB);
        assert_eq!(round_size(&c4, 5 * MIB), 5 * MIB);
        assert_eq!(round_size(&c4, 5 * MIB + 1), 6 * MIB);
        let c8 = cfg("roundup_power2_divisions:8");
        assert_eq!(round_size(&c8, 5 * MIB + 1), 5 * MIB + 512 * 1024);
        // per-interval table: [256:1,512:2,1024:4,>:8]; 600 MiB is in [512,1024) -> 2 divisions
        let cl = cfg("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
        assert_eq!(round_size(&cl, 600 * MIB), 768 * MIB);
        assert_eq!(round_size(&cl, 300 * MIB + 1), 300 * MIB + 512);
    }

    #[test]
    fn segment_sizes_and_pools() {
        let c = AllocatorConfig::default();
        assert_eq!(allocation_size(&c, 512), 2 * MIB);
        assert_eq!(allocation_size(&c, MIB), 2 * MIB);
        assert_eq!(pool_for(MIB), Pool::Small);
        assert_eq!(pool_for(MIB + 512), Pool::Large);
        assert_eq!(allocation_size(&c, MIB + 512), 20 * MIB);
        assert_eq!(allocation_size(&c, 10 * MIB - 512), 20 * MIB);
        assert_eq!(allocation_size(&c, 10 * MIB), 10 * MIB);
        // The "10 MiB + 1" example: 10 MiB + 512 -> a 12 MiB segment.
        assert_eq!(allocation_size(&c, round_size(&c, 10 * MIB + 1)), 12 * MIB);
        let big = cfg("large_segment_size_mb:64");
        assert_eq!(allocation_size(&big, 3 * MIB), 64 * MIB);
        assert_eq!(page_size(&big, Pool::Large), 64 * MIB);
        assert_eq!(page_size(&big, Pool::Small), 2 * MIB);
    }
}
