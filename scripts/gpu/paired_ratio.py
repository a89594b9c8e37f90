"""Reads the lines empty_batches.py printed (label, then ns per call of every batch) and prints,
per label, the minimum, 10th percentile and median, and the recorded/native ratios of each,
pairing the labels `native*` and `record*` of the same round suffix."""
import statistics
import sys

runs = {}
for path in sys.argv[1:]:
    for line in open(path):
        parts = line.split()
        if len(parts) > 10:
            runs[parts[0]] = [float(v) for v in parts[1:]]


def q(v, p):
    s = sorted(v)
    return s[int(p * (len(s) - 1))]


stats = {k: (min(v), q(v, 0.1), statistics.median(v), len(v)) for k, v in runs.items()}
for k, (mn, p10, med, n) in sorted(stats.items()):
    print(f"{k}: {n} batches, ns per call: min {mn:.0f}, p10 {p10:.0f}, median {med:.0f}")
for k in sorted(stats):
    if k.startswith("record"):
        n = "native" + k[len("record"):]
        if n in stats:
            r = [a / b for a, b in zip(stats[k][:3], stats[n][:3])]
            print(f"{k} / {n}: min {r[0]:.3f}x, p10 {r[1]:.3f}x, median {r[2]:.3f}x")
