#!/usr/bin/env bash
# Triton Inference Server on one H200 (#52), and the sampler (#48), carrying .whl and .tw:
# .tw holds numpy 1.26 and ml_dtypes 0.5 for CPython 3.12 (the Python backend stub needs numpy 1) and
# nvidia-pytriton 0.7.0 cut down to its tritonserver, Python backend, the 3.12 stub and their libraries
# (pytriton-slim.tar.xz: pytriton/__init__.py, pytriton/tritonserver/{bin,backends,caches,
# python_backend_stubs/3.12} and nvidia_pytriton.libs without libpython3.13, from the wheel). The
# machine's scipy is built for numpy 2: scipy 1.13.1 (cp312, 38 MB) comes too, by a call before this one
# that carries .tw2 and runs `mkdir -p /tmp/parts && cp .tw2/*.whl /tmp/parts/` (docs/journal/performance.md,
# "Triton Inference Server on one H200").
# With SAMPLER=1 first the sampler alone, the offline bench with --sample and
# `gpt2-deploy serve`'s greedy, sampled and mixed streaming loads; then (both ways) the generation model
# with the triton backend inside, served by tritonserver, under streaming loads at 1 and 64 clients,
# and `gpt2-deploy serve` on the same run beside it (TRITON_ONLY=1: Triton's greedy loads alone).
. "$(dirname "$0")/../shapes_h200/sitting.sh"
R="--preset gpt2 --run tr"
LT="$G loadtest http://127.0.0.1:8000 --duration 8 --warmup 3"
step finetune 120 $G finetune $R --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false
serve_loads() {  # NAME LOADTEST-OPTIONS...: one streaming load on `gpt2-deploy serve`, its JSON kept
  local name=$1; shift
  step "serve $name" 60 $LT "$@" --out /tmp/s_$name && cp /tmp/s_$name/loadtest.json $OUT/loadtest_s_$name.json
}
if [ -n "${SAMPLER:-}" ]; then
  step timing 120 python3 docs/journal/probes/sampling_h200/sampler_timing.py
  step bench 150 $G bench $R --device cuda --backend triton --precision fp16 --sample --batch 1,8,64 --repeats 2
  cp artifacts/tr/reports/bench.json $OUT/bench.json
fi
if [ -z "${TRITON_ONLY:-}" ]; then
  $G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve.log 2>&1 &
  SP=$!
  ready serve 150 /ready $SP
  serve_loads greedy --concurrency 1,64
  if [ -n "${SAMPLER:-}" ]; then
    serve_loads sampled --concurrency 1,64 --temperature 0.8 --top-p 0.95
    serve_loads mixed --concurrency 64 --temperature 0.8 --top-p 0.95 --sampled-share 0.5 --spread 0.9
  fi
  kill -INT $SP; wait $SP
fi
. "$(dirname "$0")/triton_venv.sh"
step "model imports" 120 $TP -c "import numpy, scipy, transformers; from transformers import GPT2LMHeadModel; print('numpy', numpy.__version__, 'scipy', scipy.__version__)"
step package 120 $G package $R --backend triton --precision fp16 --device cuda
$TP -m pipeline.cli triton-server artifacts/tr/triton > /tmp/triton.log 2>&1 &
TS=$!
ready triton 240 /v2/health/ready $TS
step "triton greedy" 60 $LT --concurrency 1,64 --triton-model gpt2 --out /tmp/t_greedy && cp /tmp/t_greedy/loadtest.json $OUT/loadtest_t_greedy.json
[ -z "${TRITON_ONLY:-}" ] && step "triton sampled" 60 $LT --concurrency 64 --temperature 0.8 --top-p 0.95 --triton-model gpt2 --out /tmp/t_sampled && cp /tmp/t_sampled/loadtest.json $OUT/loadtest_t_sampled.json
kill -INT $TS; wait $TS; echo "== triton exit $?" >> $L
grep -a -E "error|Error|READY|UNAVAILABLE" /tmp/triton.log | head -20 >> $L
grep -E "^==|^sampler|^loadtest|passed|failed|rc [1-9]|rror|numpy" $L
