"""bench.json files of back-to-back runs: each row's speed-up over eager as the ratio of the row's
and the baseline's medians, as the median of the rounds' paired ratios (what bench reports now), and,
for comparison, as the ratio of the best passes and of the mean passes; how many of each agree within
15% between every two runs given. `--rounds K` takes each row's first K passes only (as a run of
`--repeats K` would have timed them).
Usage: `python docs/journal/probes/cpu_bench_paired/ratio_agreement.py [--rounds K] RUN1.json RUN2.json [RUN3.json ...]`"""
import argparse
import itertools
import json
import statistics

ESTIMATORS = {
    "ratio of medians": lambda a, b: statistics.median(a) / statistics.median(b),
    "paired": lambda a, b: statistics.median(x / y for x, y in zip(a, b)),
    "ratio of best passes": lambda a, b: max(a) / max(b),
    "ratio of means": lambda a, b: statistics.mean(a) / statistics.mean(b),
}


def ratios(path, rounds=None):
    rows = [r for r in json.load(open(path))["rows"] if r["status"] == "ok"]
    eager = {(r["precision"], r["batch"]): r for r in rows if r["backend"] == "torch"}
    out = {}
    for r in rows:
        base = eager.get((r["precision"], r["batch"])) or eager.get(("fp32", r["batch"]))  # bench's CPU fallback
        if base is None or r["backend"] == "torch":
            continue
        a, b = r["pass_tokens_per_s"][:rounds], base["pass_tokens_per_s"][:rounds]
        out[r["backend"], r["precision"], r["batch"]] = {name: f(a, b) for name, f in ESTIMATORS.items()}
    return out


def agreeing(one, two, name):
    return sum(abs(two[key][name] / one[key][name] - 1) <= 0.15 for key in one)


parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int)
parser.add_argument("runs", nargs="+")
args = parser.parse_args()
runs = [ratios(path, args.rounds) for path in args.runs]
if len(runs) == 2:
    first, second = runs
    for key, one in first.items():
        two = second[key]
        print(f"{' '.join(map(str, key)):24}" + "   ".join(
            f"{name} {one[name]:5.2f} / {two[name]:5.2f} ({100 * (two[name] / one[name] - 1):+5.1f}%)"
            for name in ("ratio of medians", "paired")))
for i, j in itertools.combinations(range(len(runs)), 2):
    print(f"runs {i + 1} and {j + 1}, within 15% of each other: " + ", ".join(
        f"{name} {agreeing(runs[i], runs[j], name)} of {len(runs[i])}" for name in ESTIMATORS))
