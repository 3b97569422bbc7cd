#!/usr/bin/env bash
# The layer norms apart above 16 rows and attention's new shares (this change) against the tree
# before (8f88691, unpacked with `git archive 8f88691 pipeline | tar -x -C .ab/old`), on one H200: the
# GPU kernel and graph tests, then step_ab.py --int8-vs-fp16 (fp16 and int8-wo, each shape, batch
# 1 / 8 / 64, two rounds) under the old tree and then this one. Each step bounded, output into $OUT.
set -u
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { local s=$(date +%s); echo "== $1" >> $L; timeout $2 "${@:3}" >> $L 2>&1; echo "== $1: rc $? in $(( $(date +%s) - s )) s" >> $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> $L
step "gpu tests" 150 env PYTHONPATH=$PWD python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_decode_kernels_gpu.py \
  tests/runtime/static/test_cuda_graphs.py tests/runtime/static/test_triton_backend.py
for tree in old new; do
  ROOT=$([ $tree = old ] && echo "$PWD/.ab/old" || echo "$PWD")
  step "step_ab $tree" 230 env PYTHONPATH=$ROOT python3 docs/journal/probes/shapes_h200/step_ab.py --int8-vs-fp16 \
    gpt2 gpt2-medium gpt2-large gpt2-xl
done
grep -E "^==|passed|failed|Error|gpt2" $L | grep -v "^tests/" | head -80
