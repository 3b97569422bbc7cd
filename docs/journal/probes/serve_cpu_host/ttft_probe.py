"""Time to first token and end to end of 60 back-to-back streaming /v1/completions requests (16 new
tokens, greedy) against a running server, the first 10 dropped. Used with `gpt2-deploy serve --preset
tiny --run timing --device cpu --backend torch-compiled --precision fp32 --port 8123` on a 2-core CPU:
`python docs/journal/probes/serve_cpu_host/ttft_probe.py hi`."""
import statistics
import sys
import time

import httpx

url = "http://127.0.0.1:8123/v1/completions"
prompt = sys.argv[1] if len(sys.argv) > 1 else "hi"
with httpx.Client(timeout=30) as c:
    ttfts, e2e = [], []
    for i in range(60):
        t = time.perf_counter(); first = None
        with c.stream("POST", url, json={"model": "timing", "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True, "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and first is None:
                    first = time.perf_counter() - t
        e2e.append(time.perf_counter() - t); ttfts.append(first)
print(f"TTFT p50 {statistics.median(ttfts[10:])*1e3:.2f} ms, e2e p50 {statistics.median(e2e[10:])*1e3:.2f} ms")
