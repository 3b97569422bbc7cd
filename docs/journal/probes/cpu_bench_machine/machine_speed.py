"""A fixed single-thread workload (a Python integer loop) timed back to back for SECONDS: how steady
is this core's speed? Prints the runs' 5th and 95th percentiles and each second's median, all
against the median run.
Usage: `taskset -c 1 python docs/journal/probes/cpu_bench_machine/machine_speed.py SECONDS`"""
import statistics
import sys
import time


def work() -> int:
    total = 0
    for i in range(200_000):
        total += i * i
    return total


seconds = float(sys.argv[1])
stamps, rates = [], []
end = time.perf_counter() + seconds
while (now := time.perf_counter()) < end:
    work()
    stamps.append(now)
    rates.append(1 / (time.perf_counter() - now))
median = statistics.median(rates)
start = stamps[0]
per_second = [statistics.median(r for t, r in zip(stamps, rates) if k <= t - start < k + 1) / median
              for k in range(int(seconds))]
fifth, *_, ninety_fifth = statistics.quantiles(rates, n=20)
print(f"{len(rates)} runs; p5 {fifth / median:.2f}, p95 {ninety_fifth / median:.2f} of the median; "
      f"seconds' medians {min(per_second):.2f}-{max(per_second):.2f}")
print("each second:", " ".join(f"{s:.2f}" for s in per_second))
