#!/usr/bin/env bash
# What the large shapes give their clients after the 64-row tiles changed (#50): for gpt2-medium
# and gpt2-large a 2-step fine-tune (random init), one server each and the loads clients send: greedy at 1 and 64
# clients, sampled (temperature 0.8, top_p 0.95) at 64, half sampled with lengths spread 0.9 at 64.
# bash docs/journal/probes/shapes_h200/large_served.sh [preset ...]; wheels in .whl/; output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
for P in ${@:-gpt2-medium gpt2-large}; do
  R="--preset $P --run $P"
  step "finetune $P" 120 $G finetune $R $FT
  $G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve_$P.log 2>&1 &
  SP=$!
  wait_ready $P 120
  LT="$G loadtest http://127.0.0.1:8000 --duration 6 --warmup 2"
  S="--temperature 0.8 --top-p 0.95"
  step "greedy $P" 60 $LT --concurrency 1,64 --out /tmp/$P/greedy
  step "sampled $P" 40 $LT --concurrency 64 $S --out /tmp/$P/sampled
  step "mixed $P" 40 $LT --concurrency 64 $S --sampled-share 0.5 --spread 0.9 --out /tmp/$P/mixed
  kill -INT $SP; wait $SP
  for k in greedy sampled mixed; do cp /tmp/$P/$k/loadtest.json $OUT/loadtest_${P}_$k.json 2>/dev/null; done
done
grep -E "^==|rc [1-9]|Error|^loadtest|tokens/s|x\)" $L | grep -v "rc 0" | head -40
