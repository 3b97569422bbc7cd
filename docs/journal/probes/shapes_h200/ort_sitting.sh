#!/usr/bin/env bash
# ONNX Runtime's CUDA execution provider at every GPT-2 shape (#50), one-byte weights on the triton
# engine and the ort target's int8-wo profile (#51), in two runs back to back on one machine (a, then
# b). The GPU host has no network: onnxruntime-gpu 1.31.1's wheel comes in five pieces of 52 MiB
# (`split -b 52m`, in .og), the first four copied to /tmp/parts beforehand, the last joined here.
#   a: the GPU kernel tests of one-byte weights; gpt2 benched on the triton engine in fp16 and
#      int8-wo (batch 1 / 8 / 64) and int8-wo validated; the ort target's int8-wo profile (124M);
#      gpt2-medium and gpt2-large exported (ort fp16), validated (triton and ort-fused fp16 against
#      eager fp32) and benched (ort-fused fp16);
#   b: gpt2-xl: exported (ort fp16 and int8-wo), validated (triton fp16 and int8-wo, ort-fused
#      fp16), benched (triton and ort-fused, fp16 and int8-wo).
# Every run is `finetune --set train.steps=2 ...` of its preset (random init, two steps).
set -u
if [ "$1" = a ]; then
  W=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  cat $(ls /tmp/parts/$W.part-* .og/$W.part-* | awk -F'.part-' '{print $NF, $0}' | sort -u -k1,1 | cut -d' ' -f2) > /tmp/$W
  python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/$W || exit 1
fi
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
run() {  # $1 preset, $2 seconds for its finetune
  R="--preset $1 --run $1"
  [ -d artifacts/$1/checkpoint ] || step "finetune $1" $2 $G finetune $R $FT
}
keep() { cp artifacts/$1/reports/$2.json $OUT/$2_$1_$3.json 2>/dev/null; }
if [ "$1" = a ]; then
  step "gpu kernel tests" 120 python3 -m pytest -q -p no:cacheprovider tests/runtime/kernels/test_decode_kernels_gpu.py tests/runtime/static/test_cuda_graphs.py -k "one_byte or sampled_steps_replayed"
  run gpt2 90
  step "bench gpt2" 150 $G bench $R --device cuda --backend triton --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2
  keep gpt2 bench triton
  step "validate gpt2" 100 $G validate $R --device cuda --backend triton --precision int8-wo
  keep gpt2 validate triton
  step "ort int8 profile" 150 python3 docs/journal/probes/int8_h200/ort_int8_profile.py
  for P in gpt2-medium gpt2-large; do
    run $P 100
    step "export $P" 100 $G export $R --target ort --precision fp16
    step "validate $P" 150 $G validate $R --device cuda --backend triton --backend ort-fused --precision fp16
    keep $P validate both
    step "bench $P" 150 $G bench $R --device cuda --backend ort-fused --precision fp16 --batch 1,8,64 --repeats 2
    keep $P bench ort
  done
else
  run gpt2-xl 150
  for Q in fp16 int8-wo; do step "export xl $Q" 200 $G export $R --target ort --precision $Q; done
  step "validate xl" 200 $G validate $R --device cuda --backend triton --backend ort-fused --precision fp16 --precision int8-wo
  keep gpt2-xl validate both
  step "bench xl" 240 $G bench $R --device cuda --backend triton --backend ort-fused --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2
  keep gpt2-xl bench both
fi
grep -E "^==|passed|failed|rc [1-9]|Error|replay|^ +[0-9.]+ us" $L | head -60
