"""Two bench.json files of back-to-back runs: each row's speed-up over eager as the ratio of the row's
and the baseline's medians, as the median of the rounds' paired ratios (what bench reports now), and,
for comparison, as the ratio of the best passes and of the mean passes; how many of each agree within
15% between the runs. Usage: `python artifacts/results/cpu_bench_paired/ratio_agreement.py RUN1.json RUN2.json`"""
import json
import statistics
import sys

ESTIMATORS = {
    "ratio of medians": lambda a, b: statistics.median(a) / statistics.median(b),
    "paired": lambda a, b: statistics.median(x / y for x, y in zip(a, b)),
    "ratio of best passes": lambda a, b: max(a) / max(b),
    "ratio of means": lambda a, b: statistics.mean(a) / statistics.mean(b),
}


def ratios(path):
    rows = [r for r in json.load(open(path))["rows"] if r["status"] == "ok"]
    eager = {(r["precision"], r["batch"]): r for r in rows if r["backend"] == "torch"}
    out = {}
    for r in rows:
        base = eager.get((r["precision"], r["batch"])) or eager.get(("fp32", r["batch"]))  # bench's CPU fallback
        if base is None or r["backend"] == "torch":
            continue
        a, b = r["pass_tokens_per_s"], base["pass_tokens_per_s"]
        out[r["backend"], r["precision"], r["batch"]] = {name: f(a, b) for name, f in ESTIMATORS.items()}
    return out


first, second = ratios(sys.argv[1]), ratios(sys.argv[2])
for key, one in first.items():
    two = second[key]
    print(f"{' '.join(map(str, key)):24}" + "   ".join(
        f"{name} {one[name]:5.2f} / {two[name]:5.2f} ({100 * (two[name] / one[name] - 1):+5.1f}%)"
        for name in ("ratio of medians", "paired")))
agree = {name: sum(abs(second[key][name] / first[key][name] - 1) <= 0.15 for key in first) for name in ESTIMATORS}
print("within 15% of each other: " + ", ".join(f"{name} {n} of {len(first)}" for name, n in agree.items()))
