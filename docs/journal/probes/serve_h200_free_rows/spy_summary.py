"""Summarise a py-spy raw record (`py-spy record --threads -f raw`): samples per thread, the top self and inclusive frames. `python spy_summary.py FILE`."""
import collections
import sys

self_c, incl, threads = collections.Counter(), collections.Counter(), collections.Counter()
total = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); frames = stack.split(";")
    threads[frames[0]] += n
    total += n
    names = [f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")") for f in frames[1:]]
    if names:
        self_c[frames[0][:20] + " | " + names[-1]] += n
    for f in set(names):
        incl[frames[0][:20] + " | " + f] += n
print("threads:", threads.most_common(6))
print("self:"); [print(f"  {c/total:6.1%} {k}") for k, c in self_c.most_common(25)]
print("inclusive:"); [print(f"  {c/total:6.1%} {k}") for k, c in incl.most_common(40)]
