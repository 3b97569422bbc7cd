#!/usr/bin/env bash
# The A/B of the scheduler split (#47): the tree before it (055c66c, unpacked in .ab/old) and this
# one, alternated on one H200 over the same gpt2 run folder: the offline triton bench twice each,
# then one served greedy load (1 and 64 streaming clients) each. Every step bounded, output into $OUT.
. "$(dirname "$0")/sitting.sh"
NEW="env PYTHONPATH=/tmp/site:$PWD python3 -m pipeline.cli"
OLD="env PYTHONPATH=/tmp/site:$PWD/.ab/old python3 -m pipeline.cli"
R="--preset gpt2 --run lt"
step finetune 90 $NEW finetune $R --set train.steps=2 --set train.warmup_steps=0 --set train.eval_batches=1
for round in 1 2; do
  for tree in old new; do
    T=$([ $tree = old ] && echo "$OLD" || echo "$NEW")
    step "bench $tree $round" 80 $T bench $R --device cuda --backend triton --precision fp16 --batch 1,8,64 --repeats 2
    cp artifacts/lt/reports/bench.json $OUT/bench_${tree}_${round}.json 2>/dev/null
  done
done
for tree in old new; do
  T=$([ $tree = old ] && echo "$OLD" || echo "$NEW")
  $T serve $R --device cuda --backend triton --precision fp16 > /tmp/serve_$tree.log 2>&1 &
  SP=$!
  wait_ready $tree 70
  step "load $tree" 60 $NEW loadtest http://127.0.0.1:8000 --duration 6 --warmup 2 --concurrency 1,64 --out /tmp/load_$tree
  kill -INT $SP; wait $SP
  cp /tmp/load_$tree/loadtest.json $OUT/loadtest_$tree.json 2>/dev/null
done
grep -E "^==|^loadtest|rc [1-9]" $L
