#!/usr/bin/env bash
# serve on the CPU as streaming clients see it (gpt2, prompt 128, 64 new tokens, sampled t 0.8 top_p 0.95,
# 1 / 8 / 64 clients): the default choice (the fastest backend the run has), torch-compiled fp32 continuous,
# and torch-compiled fp32 --deterministic. bash docs/journal/probes/deterministic_cpu/serve_cpu.sh OUT [RUN]
# (RUN: a CPU run with `export --target ort --precision fp32 --precision int8`; default gpt2). Client
# processes share the server's cores: compare rows of one sitting only.
set -u
OUT=$1 RUN=${2:-gpt2}
mkdir -p "$OUT"
G=".venv/bin/python -m pipeline.cli"
serve_and_load() {  # NAME, serve's options...
  local name=$1; shift
  $G serve --preset gpt2 --run "$RUN" --device cpu --port 8123 "$@" > "$OUT/serve_$name.log" 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:8123/ready > /dev/null; do sleep 1; kill -0 $pid 2>/dev/null || return 1; done
  $G loadtest http://127.0.0.1:8123 --concurrency 1,8,64 --prompt-tokens 128 --max-tokens 64 --temperature 0.8 \
    --top-p 0.95 --duration 30 --warmup 5 --out "$OUT/load_$name" > "$OUT/load_$name.log" 2>&1
  kill -TERM $pid; wait $pid
  grep -m1 "^serve:" "$OUT/serve_$name.log"
  grep -E "^\|" "$OUT/load_$name.log" | head -6
}
serve_and_load fastest
serve_and_load compiled --backend torch-compiled --precision fp32
serve_and_load deterministic --backend torch-compiled --precision fp32 --deterministic
