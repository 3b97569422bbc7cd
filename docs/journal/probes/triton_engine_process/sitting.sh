#!/usr/bin/env bash
# #73 on one GPU: the Triton model running serve's engine process against `gpt2-deploy serve` on the
# same run, streaming, greedy and sampled (t 0.8, top_p 0.95), 1 and 64 clients. Carries .whl and .tw
# (docs/journal/probes/triton_h200/carried_wheels.sh builds them), after a call that carries .tw2 (scipy 1.13.1)
# and runs `mkdir -p /tmp/parts && cp .tw2/*.whl /tmp/parts/`. First #74's scoring probe
# (docs/journal/probes/scoring_gpu/score_time.py); last #74's serve --deterministic on triton
# (docs/journal/probes/deterministic_gpu/check.py, default mode too): those two with EXTRAS=1.
# DURATION and WARMUP: each load level's seconds (default 8 and 3). Output into $OUT.
. "$(dirname "$0")/../shapes_h200/sitting.sh"
R="--preset gpt2 --run tr"
LT="$G loadtest http://127.0.0.1:8000 --duration ${DURATION:-8} --warmup ${WARMUP:-3} --concurrency 1,64"
SAMPLED="--temperature 0.8 --top-p 0.95"
load() {  # NAME LOADTEST-OPTIONS...: one streaming sweep, its JSON kept
  local name=$1; shift
  step "$name" 90 $LT "$@" --out /tmp/$name && cp /tmp/$name/loadtest.json $OUT/loadtest_$name.json
}
[ -n "${EXTRAS:-}" ] && step scoring 120 python3 docs/journal/probes/scoring_gpu/score_time.py
step finetune 120 $G finetune $R --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false
$G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve.log 2>&1 &
SP=$!
ready serve 150 /ready $SP
load serve_greedy
load serve_sampled $SAMPLED
[ -n "${EXTRAS:-}" ] && step "check default" 120 python3 docs/journal/probes/deterministic_gpu/check.py http://127.0.0.1:8000 tr default
kill -INT $SP; wait $SP
. "$(dirname "$0")/../triton_h200/triton_venv.sh"
step package 120 $G package $R --backend triton --precision fp16 --device cuda
$TP -m pipeline.cli triton-server artifacts/tr/triton > /tmp/triton.log 2>&1 &
TS=$!
ready triton 240 /v2/health/ready $TS
load triton_greedy --triton-model gpt2
load triton_sampled --triton-model gpt2 $SAMPLED
curl -s http://127.0.0.1:8002/metrics | grep -E "^gpt2deploy|^nv_inference_request_success" | head -12 >> $L
kill -INT $TS; wait $TS; echo "== triton exit $?" >> $L
grep -a -E "error|Error|UNAVAILABLE" /tmp/triton.log | head -10 >> $L
if [ -n "${EXTRAS:-}" ]; then
  $G serve $R --device cuda --backend triton --precision fp16 --deterministic > /tmp/serve_det.log 2>&1 &
  SP=$!
  ready deterministic 150 /ready $SP
  step "check deterministic" 120 python3 docs/journal/probes/deterministic_gpu/check.py http://127.0.0.1:8000 tr deterministic
  load det_sampled $SAMPLED
  kill -INT $SP; wait $SP
  grep -a -E "Error" /tmp/serve_det.log | head -5 >> $L
fi
python3 - "$OUT" <<'PY' >> $L
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("loadtest_*.json")):
    for r in json.loads(f.read_text())["rows"]:
        print(f"{f.stem[9:]} c{r['concurrency']}: {r['tokens_per_s']:,.0f} tok/s itl p50 {r['itl_ms']['p50']:.2f} ms "
              f"ttft p50 {r['ttft_ms']['p50']:.1f} ms tpot p50 {r['tpot_ms']['p50']:.3f} ms errors {r['errors']}")
PY
grep -E "^==|^serve_|^triton_|^det_|rc [1-9]|rror|^gpt2deploy|^prefill|^own|^deterministic" $L | tail -45
