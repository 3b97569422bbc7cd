#!/usr/bin/env bash
# Every GPT-2 shape on one H200 (#50), second sitting: gpt2-xl served (1 and 64 streaming clients)
# and validated (triton fp16 against eager fp32), then gpt2-medium and gpt2-large fine-tuned 2 steps
# and benched (triton, torch-compiled, eager baseline) at batch 1 / 8 / 64. $1: which part (xl | ml).
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
if [ "$1" = xl ]; then
  R="--preset gpt2-xl --run xl"
  [ -d artifacts/xl/checkpoint ] || step "finetune xl" 150 $G finetune $R $FT
  $G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve_xl.log 2>&1 &
  SP=$!
  wait_ready xl 150
  step "load xl" 80 $G loadtest http://127.0.0.1:8000 --duration 6 --warmup 2 --concurrency 1,64 --out /tmp/load_xl
  kill -INT $SP; wait $SP
  cp /tmp/load_xl/loadtest.json $OUT/loadtest_xl.json 2>/dev/null
  tail -3 /tmp/serve_xl.log >> $L
  step "validate xl" 200 $G validate $R --device cuda --backend triton --precision fp16
  cp artifacts/xl/reports/validate.json $OUT/validate_xl.json 2>/dev/null
else
  for P in gpt2-medium gpt2-large; do
    R="--preset $P --run $P"
    step "finetune $P" 90 $G finetune $R $FT
    step "bench $P" 170 $G bench $R --device cuda --backend torch --backend torch-compiled --backend triton --precision fp16 --batch 1,8,64 --repeats 2
    cp artifacts/$P/reports/bench.json $OUT/bench_$P.json 2>/dev/null
  done
fi
grep -E "^==|^loadtest|rc [1-9]" $L
