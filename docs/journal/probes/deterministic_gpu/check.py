"""#74's deterministic check against a running server: the CI test's 200 seeded requests
(tests/serve/test_deterministic.py's seeded_requests, written to requests.json here, since the GPU
machine may lack that test's client) sent alone, then 64 at a time, then alone again; how many texts match.
    python docs/journal/probes/deterministic_gpu/check.py URL MODEL LABEL"""

import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CLIENTS = 64


def main() -> None:
    url, model, label = sys.argv[1:4]

    def text(body: dict) -> str:
        request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as reply:
            return json.loads(reply.read())["choices"][0]["text"]

    requests = [{**body, "model": model} for body in json.loads(Path(__file__).with_name("requests.json").read_text())]
    alone = [text(body) for body in requests]
    with ThreadPoolExecutor(CLIENTS) as pool:
        together = list(pool.map(text, requests))
    again = [text(body) for body in requests]
    same = sum(a == b for a, b in zip(alone, together))
    rerun = sum(a == b for a, b in zip(alone, again))
    print(f"deterministic {label}: alone vs beside {CLIENTS - 1} others {same}/{len(requests)}, "
          f"alone run to run {rerun}/{len(requests)}, distinct texts {len(set(alone))}")


if __name__ == "__main__":
    main()
