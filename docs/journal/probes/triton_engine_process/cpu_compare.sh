#!/usr/bin/env bash
# The Triton model against `gpt2-deploy serve` on this machine's CPU (tiny preset, torch-compiled fp32),
# streaming greedy at 1 and 64 clients: where one response sender caps the model's tokens/s, the CPU
# shows it too. bash docs/journal/probes/triton_engine_process/cpu_compare.sh OUT [LABEL]
# (LABEL names the Triton load's file: the model.py packaged is the working tree's).
set -u
OUT=$1; LABEL=${2:-triton}; mkdir -p $OUT
G=".venv/bin/python -m pipeline.cli"
R="--preset tiny --run tt"
LT="$G loadtest http://127.0.0.1:8000 --duration 10 --warmup 3 --concurrency 1,64 --prompt-tokens 32 --max-tokens 64"
ready() { for _ in $(seq 300); do curl -sf http://127.0.0.1:8000$1 >/dev/null && return 0; sleep 1; done; return 1; }
[ -e artifacts/tt/checkpoint ] || $G finetune $R --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 \
  --set train.eval_batches=1 --set train.compile=false --set train.device=cpu > $OUT/finetune.log 2>&1
if [ ! -e $OUT/loadtest_serve.json ]; then
  $G serve $R --device cpu --backend torch-compiled --precision fp32 > $OUT/serve.log 2>&1 &
  SP=$!; ready /ready && $LT --out /tmp/cc_serve > $OUT/serve_load.log 2>&1; cp /tmp/cc_serve/loadtest.json $OUT/loadtest_serve.json
  kill -INT $SP; wait $SP
fi
rm -rf artifacts/tt/triton
$G package $R --backend torch-compiled --precision fp32 --device cpu > $OUT/package.log 2>&1
.venv-triton/bin/python -m pipeline.cli triton-server artifacts/tt/triton > $OUT/triton_$LABEL.log 2>&1 &
TS=$!; ready /v2/health/ready && $LT --triton-model gpt2 --out /tmp/cc_t > $OUT/triton_${LABEL}_load.log 2>&1
cp /tmp/cc_t/loadtest.json $OUT/loadtest_$LABEL.json
kill -INT $TS; wait $TS
.venv/bin/python - $OUT <<'PY'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("loadtest_*.json")):
    for r in json.loads(f.read_text())["rows"]:
        print(f"{f.stem[9:]} c{r['concurrency']}: {r['tokens_per_s']:,.0f} tok/s itl p50 {r['itl_ms']['p50']:.2f} ms "
              f"ttft p50 {r['ttft_ms']['p50']:.1f} ms errors {r['errors']}")
PY
