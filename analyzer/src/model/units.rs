//! Byte quantities as people write them (`6GiB`, `1.5GB`, `512MiB`, `1048576`) and as we print
//! them (binary units, two decimals, like PyTorch's OOM message).

/// Parses a byte quantity (`6GiB`, `1.5GB`, `512MiB`, `1048576`): the recorder's parser, so
/// the CLI and the recorder's `ALLOCTRACE_CAPACITY` read a size the same way.
pub use recorder::engine::config::parse_bytes;

/// Formats bytes in binary units with two decimals: `512 B`, `4.00 MiB`, `1.80 GiB`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", UNITS[i])
}

/// An amount of memory to give: as [`fmt_bytes`], rounded up in its last place, so that the figure
/// read back (`--capacity 5.83GiB`, or a fraction worked out from it) is never less than `bytes`.
pub fn fmt_need(bytes: u64) -> String {
    let shown = fmt_bytes(bytes);
    let Some((_, unit)) = shown.split_once(' ').filter(|_| bytes >= 1024) else { return shown };
    let scale = 1u64 << (10 * (["KiB", "MiB", "GiB", "TiB", "PiB"].iter().position(|u| *u == unit).unwrap_or(0) + 1));
    // Hundredths of the unit, rounded up: exact integer arithmetic, no float rounding.
    let hundredths = (bytes as u128 * 100).div_ceil(scale as u128);
    format!("{}.{:02} {unit}", hundredths / 100, hundredths % 100)
}

/// A count and its noun, singular for one: `1 live block`, `3 live blocks`.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// For `#[serde(skip_serializing_if)]`: a count or a byte figure of zero is left out of the JSON.
pub fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A capacity as a user would type it to `--capacity`, and whether it is the capacity exactly:
/// whole GiB or MiB where it is one; else rounded down, to the hundredth of a GiB from 1 GiB up
/// (`78.59GiB` for 84,391,690,240 bytes) and to the MiB below, where byte-exact figures of
/// eleven digits would be unreadable and a limit inferred from an OOM is not that exact anyway.
pub fn capacity_arg(bytes: u64) -> (String, bool) {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes > 0 && bytes.is_multiple_of(GIB) {
        (format!("{}GiB", bytes / GIB), true)
    } else if bytes > 0 && bytes.is_multiple_of(MIB) {
        (format!("{}MiB", bytes / MIB), true)
    } else if bytes >= GIB {
        // Hundredths of a GiB, rounded down, in integers (no float rounding up past the limit).
        let hundredths = (bytes as u128 * 100 / GIB as u128) as u64;
        (format!("{}.{:02}GiB", hundredths / 100, hundredths % 100), false)
    } else if bytes >= MIB {
        (format!("{}MiB", bytes / MIB), false)
    } else {
        (bytes.to_string(), true)
    }
}

/// Formats a signed byte difference: `+4.00 MiB`, `-512 B`.
pub fn fmt_delta(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(delta.unsigned_abs()))
}

/// A limit as every output says it: its bytes, or "no limit".
pub fn fmt_limit(limit: Option<u64>) -> String {
    limit.map(fmt_bytes).unwrap_or_else(|| "no limit".into())
}

/// A share as a percentage with one decimal: `0.1234` is "12.3%".
pub fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Formats nanoseconds as seconds or milliseconds.
pub fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.3} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3} ms", ns as f64 / 1e6)
    } else {
        format!("{:.3} us", ns as f64 / 1e3)
    }
}

/// Serializes a byte figure computed as a float (a median of changes) as a whole number of
/// bytes: JSON gives byte quantities as integers.
pub fn whole_bytes<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_i64(v.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("6GiB"), Ok(6 << 30));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("2 g"), Ok(2 << 30));
        assert!(parse_bytes("6 bananas").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("-5").is_err());
    }

    #[test]
    fn formats_binary_units() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(4 << 20), "4.00 MiB");
        assert_eq!(fmt_bytes(1_929_379_840), "1.80 GiB");
        assert_eq!(fmt_delta(-(2 << 20)), "-2.00 MiB");
    }

    /// An amount to give reads back as no less than the bytes: GPT-2's smallest limit under
    /// `max_split_size_mb:64,roundup_power2_divisions:4`, 5.8203 GiB, is shown as 5.83 GiB, where
    /// `fmt_bytes`'s 5.82 GiB (6,249,172,910 bytes) ran out of memory in PyTorch.
    #[test]
    fn needs_round_up() {
        assert_eq!(fmt_bytes(6_249_512_960), "5.82 GiB");
        assert_eq!(fmt_need(6_249_512_960), "5.83 GiB");
        assert!(parse_bytes("5.83GiB").unwrap() >= 6_249_512_960);
        assert_eq!(fmt_need(6 << 30), "6.00 GiB");
        assert_eq!(fmt_need((6 << 30) + 1), "6.01 GiB");
        assert_eq!(fmt_need(512), "512 B");
        assert_eq!(fmt_need(1536), "1.50 KiB");
    }

    /// A limit to type back: exact where it is whole GiB or MiB, else rounded down (a limit
    /// given above the one the trace had could hide its failure) and readable.
    #[test]
    fn capacity_args_read_back_at_or_below_the_limit() {
        assert_eq!(capacity_arg(80 << 30), ("80GiB".into(), true));
        assert_eq!(capacity_arg(6100 << 20), ("6100MiB".into(), true));
        assert_eq!(capacity_arg(84_391_690_240), ("78.59GiB".into(), false));
        assert_eq!(capacity_arg((1 << 30) + 1), ("1.00GiB".into(), false));
        assert_eq!(capacity_arg((300 << 20) + 7), ("300MiB".into(), false));
        assert_eq!(capacity_arg(4096), ("4096".into(), true));
        for bytes in [84_391_690_240u64, 6_474_663_198, (1 << 30) + 1, (300 << 20) + 7] {
            let (text, _) = capacity_arg(bytes);
            let back = parse_bytes(&text).unwrap();
            assert!(back <= bytes && bytes - back < (1 << 30) / 100 + 1, "{text}: {back} vs {bytes}");
        }
    }
}
