#!/usr/bin/env bash
# gpt2-xl on one H200, first sitting: fine-tune 2 steps, the triton and torch-compiled decode at
# batch 1 / 8 / 64 (batch > 1 raised before the K-tile chooser learnt 1,600), and the ort target's
# fp16 graph (3.1 GB: over protobuf's 2 GB, so its weights go to model.onnx.data). Each step bounded,
# its output into $OUT as it comes.
. "$(dirname "$0")/sitting.sh"
R="--preset gpt2-xl --run xl"
step finetune 150 $G finetune $R --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 \
  --set train.eval_batches=1 --set train.compile=false
step bench 240 $G bench $R --device cuda --backend triton --backend torch-compiled --precision fp16 --batch 1,8,64 --repeats 2
cp artifacts/xl/reports/bench.json $OUT/bench_xl.json 2>/dev/null
step export 170 $G export $R --target ort --precision fp16
ls -la artifacts/xl/onnx-ort/fp16 >> $L 2>&1
grep -E "^==|rc [1-9]|Error|error" $L | head -30
