#!/usr/bin/env bash
# The first H200 sitting (first_kernel/; run from the repository root with the serve wheels in .whl/):
# GPU tests of the device sampler and the split scheduler, the offline bench with a sampled row beside
# each greedy one, then one server and the loads a client sends: greedy 1 and 64 clients, sampled
# (temperature 0.8, top_p 0.95) 1 and 64 clients, a mixed load (half sampled, lengths spread 0.9) at 64,
# greedy 1 client again.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
G="python3 -m pipeline.cli"
R="--preset gpt2 --run lt"
W=/tmp/res; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
$G finetune $R --set train.steps=2 --set train.warmup_steps=0 --set train.eval_batches=1 > $W/finetune.log 2>&1 || { tail -20 $W/finetune.log; exit 1; }
python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_sampling_kernels.py tests/runtime/static/test_cuda_graphs.py \
  tests/runtime/test_scheduler.py > $W/gpu_tests.log 2>&1; tail -2 $W/gpu_tests.log
$G bench $R --device cuda --backend triton --precision fp16 --sample --repeats 3 > $W/bench.log 2>&1 || tail -20 $W/bench.log
cp artifacts/lt/reports/bench.json artifacts/lt/reports/bench.md $W/
$G serve $R --device cuda --backend triton --precision fp16 > $W/serve.log 2>&1 &
SP=$!
python3 -c "
import time, urllib.request
for _ in range(180):
    try: urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2); break
    except Exception: time.sleep(1)
else: raise SystemExit('not ready')" || { tail -20 $W/serve.log; exit 1; }
L="$G loadtest http://127.0.0.1:8000 --duration 8 --warmup 3"
SAMPLED="--temperature 0.8 --top-p 0.95"
$L --concurrency 1,64 --out $W/greedy > $W/loadtest.log 2>&1
$L --concurrency 1,64 $SAMPLED --out $W/sampled >> $W/loadtest.log 2>&1
$L --concurrency 64 $SAMPLED --sampled-share 0.5 --spread 0.9 --out $W/mixed >> $W/loadtest.log 2>&1
$L --concurrency 1 --out $W/greedy_again >> $W/loadtest.log 2>&1
grep -E "^loadtest" $W/loadtest.log
kill -INT $SP; wait $SP; echo "serve exit $?"
tar czf $OUT/sampling_h200.tgz -C $W .
