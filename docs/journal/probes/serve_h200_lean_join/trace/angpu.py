"""Medians of the CUDA events tr.ev wrote per join (/tmp/trlog/gpu_*.txt): when the device reached each
mark after the prefill's start, and when the host had enqueued it; the first five joins dropped."""
import collections
import glob
import statistics

g, h = collections.defaultdict(list), collections.defaultdict(list)
for f in glob.glob("/tmp/trlog/gpu_*.txt"):
    for line in list(open(f))[5:]:
        for item in line.split():
            l, v = item.split(":"); a, b = v.split("/"); g[l].append(float(a)); h[l].append(float(b))
for l in g:
    print(f"gpu {l}: device {statistics.median(g[l]):.3f} ms after p0, enqueued {statistics.median(h[l]):.3f} ms after p0 (n={len(g[l])})")
