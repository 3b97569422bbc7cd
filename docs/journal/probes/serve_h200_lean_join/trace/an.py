"""Medians of the hops stamped in /tmp/trlog (tr.py), per request from its send, the first five dropped."""
import collections
import glob
import statistics

ev = []
for f in glob.glob("/tmp/trlog/*.log"):
    for line in open(f):
        t, label = line.split(" ", 1); ev.append((float(t), label.strip()))
ev.sort()
# split into requests at each c0
reqs, cur = [], None
for t, l in ev:
    if l.startswith("c0"):
        cur = []; reqs.append(cur)
    if cur is not None:
        cur.append((t, l))
deltas = collections.defaultdict(list)
for r in reqs[5:]:
    t0 = r[0][0]; seen = set(); prev = t0
    for t, l in r:
        if l in seen: continue
        seen.add(l)
        deltas[l].append(((t - t0) * 1e3, (t - prev) * 1e3)); prev = t
        if l.startswith("c2"): break
order = sorted(deltas, key=lambda l: statistics.median(x[0] for x in deltas[l]))
for l in order:
    print(f"{l:16s} at {statistics.median(x[0] for x in deltas[l]):7.3f} ms  (+{statistics.median(x[1] for x in deltas[l]):.3f})  n={len(deltas[l])}")

cyc=[reqs[i+1][0][0]-reqs[i][0][0] for i in range(5,len(reqs)-1)]
print("cycle (send to next send) p50 %.3f ms" % (statistics.median(cyc)*1e3))
