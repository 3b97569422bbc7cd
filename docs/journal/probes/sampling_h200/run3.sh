#!/usr/bin/env bash
# The third sampling sitting (acceptance pass over every block at once): the sampler alone, the
# offline bench with a sampled row beside each greedy one, then one server and, back to back, greedy,
# sampled and mixed streaming loads and greedy once more at 1 client.
. "$(dirname "$0")/../shapes_h200/sitting.sh"
R="--preset gpt2 --run lt"
step finetune 120 $G finetune $R --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false
step timing 120 python3 docs/journal/probes/sampling_h200/sampler_timing.py
step bench 150 $G bench $R --device cuda --backend triton --precision fp16 --sample --batch 1,8,64 --repeats 2
cp artifacts/lt/reports/bench.json $OUT/bench.json 2>/dev/null
$G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve.log 2>&1 &
SP=$!
wait_ready serve 90
LT="$G loadtest http://127.0.0.1:8000 --duration 8 --warmup 3"
SAMPLED="--temperature 0.8 --top-p 0.95"
step greedy 60 $LT --concurrency 1,64 --out /tmp/greedy
step sampled 60 $LT --concurrency 1,64 $SAMPLED --out /tmp/sampled
step mixed 60 $LT --concurrency 64 $SAMPLED --sampled-share 0.5 --spread 0.9 --out /tmp/mixed
step greedy1 40 $LT --concurrency 1 --out /tmp/greedy1
kill -INT $SP; wait $SP
for n in greedy sampled mixed greedy1; do cp /tmp/$n/loadtest.json $OUT/loadtest_$n.json; done
tail -3 /tmp/serve.log >> $L
grep -E "^==|^sampler|rc [1-9]|Error" $L
