#!/usr/bin/env bash
# gpt2-xl through the CLI after its 64-row QKV and fc tiles went deeper (weight bytes in flight): the
# GPU kernel and graph tests, a 2-step fine-tune (random init), the triton bench (fp16 against
# int8-wo, batch 1 / 8 / 64), validate of triton fp16, the server at 1 and 64 streaming clients, and
# the eager baseline's bench. Each step bounded, output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
R="--preset gpt2-xl --run xl"
step "gpu tests" 150 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_decode_kernels_gpu.py \
  tests/runtime/static/test_cuda_graphs.py tests/runtime/static/test_triton_backend.py
step "finetune xl" 100 $G finetune $R $FT
step "bench xl" 100 $G bench $R --device cuda --backend triton --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2
cp artifacts/xl/reports/bench.json $OUT/bench_gpt2-xl.json 2>/dev/null
step "validate xl" 120 $G validate $R --device cuda --backend triton --precision fp16
cp artifacts/xl/reports/validate.json $OUT/validate_gpt2-xl.json 2>/dev/null
$G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve_xl.log 2>&1 &
SP=$!
wait_ready xl 120
step "load xl" 60 $G loadtest http://127.0.0.1:8000 --duration 6 --warmup 2 --concurrency 1,64 --out /tmp/load_xl
kill -INT $SP; wait $SP
cp /tmp/load_xl/loadtest.json $OUT/loadtest_gpt2-xl.json 2>/dev/null
step "bench xl eager" 90 $G bench $R --device cuda --backend torch --precision fp16 --batch 1,8,64 --repeats 1
cp artifacts/xl/reports/bench.json $OUT/bench_gpt2-xl_eager.json 2>/dev/null
grep -E "^==|passed|failed|rc [1-9]|Error|^\| (triton|torch)|^loadtest|tokens/s" $L | grep -v "^tests/" | head -40
