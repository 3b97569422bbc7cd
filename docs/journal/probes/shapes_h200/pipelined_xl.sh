#!/usr/bin/env bash
# After attention at 64 rows lost its block fetched ahead (#50): the GPU kernel tests (attention at the tuned
# shares), then gpt2-xl fp16 through the CLI at batch 1 / 8 / 64 (2-step fine-tune). Output into $OUT.
. "$(dirname "$0")/sitting.sh"
step "gpu tests" 120 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_decode_kernels_gpu.py
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
step "finetune xl" 120 $G finetune --preset gpt2-xl --run xl $FT
step "bench xl" 150 $G bench --preset gpt2-xl --run xl --device cuda --backend triton --precision fp16 --batch 1,8,64 --repeats 2
cp artifacts/xl/reports/bench.json $OUT/bench_gpt2-xl.json 2>/dev/null
grep -E "^==|rc [1-9]|Error|passed|failed" $L | cut -c1-300 | head -30
