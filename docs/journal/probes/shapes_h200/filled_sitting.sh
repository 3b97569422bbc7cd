#!/usr/bin/env bash
# The serving scheduler's attention (FILLED shares) with no block fetched ahead above 32 rows (#50):
# filled_walk.py found it 4-13% faster alone at 64 rows; served at 124M it was 2-4% slower for greedy
# clients and even for sampled ones, so it was not shipped (to rerun it, put `fetch_ahead=batch <= 32`
# back into attention_config's FILLED shares first). Its GPU test, then what 64 streaming clients
# get from the tree before (HEAD unpacked in .ab/old: `git archive HEAD pipeline serve | tar -x -C
# .ab/old`) and this one, alternated twice over one gpt2 run folder (greedy, then sampled at
# temperature 0.8, top_p 0.95), then gpt2-medium served by this tree if time is left.
# bash docs/journal/probes/shapes_h200/filled_sitting.sh; wheels in .whl/; output into $OUT.
. "$(dirname "$0")/sitting.sh"
NEW="env PYTHONPATH=/tmp/site:$PWD python3 -m pipeline.cli"
OLD="env PYTHONPATH=/tmp/site:$PWD/.ab/old python3 -m pipeline.cli"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
step "gpu test" 150 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_decode_kernels_gpu.py -k attention
served() {  # TREE PRESET RUN LABEL LOADS...
  local T=$([ $1 = old ] && echo "$OLD" || echo "$NEW")
  $T serve --preset $2 --run $3 --device cuda --backend triton --precision fp16 > /tmp/serve_$4.log 2>&1 &
  local SP=$!
  wait_ready $4 120
  local LT="$NEW loadtest http://127.0.0.1:8000 --duration 6 --warmup 2"
  step "greedy $4" 60 $LT --concurrency ${5:-64} --out /tmp/$4/greedy
  step "sampled $4" 40 $LT --concurrency 64 --temperature 0.8 --top-p 0.95 --out /tmp/$4/sampled
  kill -INT $SP; wait $SP
  for k in greedy sampled; do cp /tmp/$4/$k/loadtest.json $OUT/loadtest_$4_$k.json 2>/dev/null; done
}
step "finetune gpt2" 60 $NEW finetune --preset gpt2 --run g $FT
for round in 1 2; do for tree in old new; do served $tree gpt2 g ${tree}_$round; done; done
step "finetune medium" 90 $NEW finetune --preset gpt2-medium --run m $FT
served new gpt2-medium m medium 1,64
grep -E "^==|rc [1-9]|Error|^loadtest|passed|failed" $L | grep -v "rc 0" | head -40
