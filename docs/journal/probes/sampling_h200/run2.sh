#!/usr/bin/env bash
# The second H200 sitting (block_kernel/), every step bounded, its output into $OUT as it comes: the
# sampler alone (sampler_timing.py), the offline bench with sampled rows, then one server and sampled
# and greedy clients. The mixed and the last greedy load ran past their 20 s bounds (client start-up)
# and gave no figures.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=$OUT/log.txt
G="python3 -m pipeline.cli"
R="--preset gpt2 --run lt"
step() { local s=$(date +%s); echo "== $1" >> $L; timeout $2 "${@:3}" >> $L 2>&1; echo "== $1: rc $? in $(( $(date +%s) - s )) s" >> $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> $L
step finetune 90 $G finetune $R --set train.steps=2 --set train.warmup_steps=0 --set train.eval_batches=1
grep -c . $L > /dev/null
step timing 120 python3 docs/journal/probes/sampling_h200/sampler_timing.py
step bench 110 $G bench $R --device cuda --backend triton --precision fp16 --sample --batch 1,8,64 --repeats 2
cp artifacts/lt/reports/bench.json $OUT/bench.json 2>/dev/null
$G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve.log 2>&1 &
SP=$!
step ready 60 python3 -c "
import time, urllib.request
while True:
    try: urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2); break
    except Exception: time.sleep(1)"
step sampled 40 $G loadtest http://127.0.0.1:8000 --duration 6 --warmup 2 --concurrency 1,64 --temperature 0.8 --top-p 0.95 --out /tmp/sampled
step mixed 20 $G loadtest http://127.0.0.1:8000 --duration 6 --warmup 2 --concurrency 64 --temperature 0.8 --top-p 0.95 --sampled-share 0.5 --spread 0.9 --out /tmp/mixed
step greedy 20 $G loadtest http://127.0.0.1:8000 --duration 6 --warmup 2 --concurrency 1 --out /tmp/greedy
kill -INT $SP; wait $SP
cp /tmp/sampled/loadtest.json $OUT/loadtest_sampled.json; cp /tmp/mixed/loadtest.json $OUT/loadtest_mixed.json
cp /tmp/greedy/loadtest.json $OUT/loadtest_greedy.json; tail -5 /tmp/serve.log >> $L
grep -E "^==|^sampler|^loadtest|rc [1-9]" $L
