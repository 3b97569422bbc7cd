"""Two bench.json files of back-to-back runs: each row's speed-up over eager both ways, the ratio of the
row's and the baseline's medians and the median of the rounds' paired ratios (what bench reports now),
and how many of each agree within 15% between the runs. Usage:
`python artifacts/results/cpu_bench_paired/ratio_agreement.py RUN1.json RUN2.json`"""
import json
import statistics
import sys


def ratios(path):
    rows = [r for r in json.load(open(path))["rows"] if r["status"] == "ok"]
    eager = {(r["precision"], r["batch"]): r for r in rows if r["backend"] == "torch"}
    out = {}
    for r in rows:
        base = eager.get((r["precision"], r["batch"])) or eager.get(("fp32", r["batch"]))  # bench's CPU fallback
        if base is None or r["backend"] == "torch":
            continue
        paired = statistics.median(a / b for a, b in zip(r["pass_tokens_per_s"], base["pass_tokens_per_s"]))
        out[r["backend"], r["precision"], r["batch"]] = (r["tokens_per_s"] / base["tokens_per_s"], paired)
    return out


first, second = ratios(sys.argv[1]), ratios(sys.argv[2])
agree = [0, 0]
for key, (medians, paired) in first.items():
    changes = [second[key][0] / medians - 1, second[key][1] / paired - 1]
    agree = [n + (abs(c) <= 0.15) for n, c in zip(agree, changes)]
    print(f"{' '.join(map(str, key)):24} ratio of medians {medians:5.2f} / {second[key][0]:5.2f} ({100 * changes[0]:+5.1f}%)"
          f"   paired {paired:5.2f} / {second[key][1]:5.2f} ({100 * changes[1]:+5.1f}%)")
print(f"within 15% of each other: ratio of medians {agree[0]} of {len(first)}, paired {agree[1]} of {len(first)}")
