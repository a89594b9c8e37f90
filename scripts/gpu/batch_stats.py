"""Reads the lines empty_batches.py prints (a label such as native2 or record2, then the ns per
call of every batch) from the files given, and prints per label the best batch, the 10th
percentile and the median, and for each label beside `native<round>` of the same round the
ratios of the three."""
import statistics
import sys

rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        parts = line.split()
        if len(parts) > 10:
            rows[parts[0]] = [float(v) for v in parts[1:]]


def q(v, f):
    s = sorted(v)
    return s[int(f * (len(s) - 1))]


stats = {k: (min(v), q(v, 0.1), statistics.median(v)) for k, v in rows.items()}
for k in sorted(stats):
    kind = k.rstrip("0123456789")
    base = stats.get("native" + k[len(kind):]) if kind != "native" else None
    ratio = ("   x native of its round (min p10 median): " + " ".join(f"{a / b:.3f}x" for a, b in zip(stats[k], base))
             if base else "")
    print(f"{k:10s} ns/call min {stats[k][0]:.0f} p10 {stats[k][1]:.0f} median {stats[k][2]:.0f}{ratio}")
