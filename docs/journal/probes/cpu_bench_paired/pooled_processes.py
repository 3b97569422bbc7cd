"""Would a bench that pools its rounds from two processes agree better between runs? Computed from four
recorded runs of the same code (two back-to-back pairs, two days): each row's paired ratio to eager
as the median over the rounds of two runs together, one run of each pair on each side, against single
runs. Usage, from this folder: `python pooled_processes.py`"""
import itertools
import json
import statistics

RUNS = {"A1": "bench_run1.json", "A2": "bench_run2.json",
        "B1": "half_second_passes/shipped_run1.json", "B2": "half_second_passes/shipped_run2.json"}


def paired_ratios(path):
    """{row: [its pass over eager's pass of the same round, per round]}"""
    rows = [r for r in json.load(open(path))["rows"] if r["status"] == "ok"]
    eager = {(r["precision"], r["batch"]): r for r in rows if r["backend"] == "torch"}
    out = {}
    for r in rows:
        base = eager.get((r["precision"], r["batch"])) or eager.get(("fp32", r["batch"]))
        if base is not None and r["backend"] != "torch":
            out[r["backend"], r["precision"], r["batch"]] = [a / b for a, b in zip(r["pass_tokens_per_s"], base["pass_tokens_per_s"])]
    return out


runs = {name: paired_ratios(path) for name, path in RUNS.items()}
keys = set.intersection(*(set(r) for r in runs.values()))


def pooled(names):
    return {k: statistics.median(x for n in names for x in runs[n][k]) for k in keys}


def agreeing(one, two):
    return sum(abs(two[k] / one[k] - 1) <= 0.15 for k in keys)


for a, b in itertools.combinations(runs, 2):
    print(f"single runs {a} / {b}: {agreeing(pooled([a]), pooled([b]))} of {len(keys)} within 15%")
for one, two in ((("A1", "B1"), ("A2", "B2")), (("A1", "B2"), ("A2", "B1"))):
    print(f"two runs pooled {'+'.join(one)} / {'+'.join(two)}: {agreeing(pooled(one), pooled(two))} of {len(keys)} within 15%")
