#!/usr/bin/env bash
# The CPU sampler, an older revision against this tree: the draw alone (sampler_ab.py), then the int8
# graph's sampled and greedy bench rows, the two trees alternated.
#   bash docs/journal/probes/cpu_int8/sampler_ab.sh OLD_REV ARTIFACTS RUN [BATCH] [ROUNDS]
set -euo pipefail
old_rev=$1; artifacts=$2; run=$3; batch=${4:-8}; rounds=${5:-3}
here=$(pwd); old=$(mktemp -d)
trap 'rm -rf "$old"' EXIT
git archive "$old_rev" | tar -x -C "$old"
.venv/bin/python docs/journal/probes/cpu_int8/sampler_ab.py "$old/pipeline/runtime/sampler.py"
for round in $(seq "$rounds"); do
  for tree in "$old" "$here"; do
    name=$([ "$tree" = "$here" ] && echo new || echo old)
    (cd "$tree" && "$here/.venv/bin/python" -m pipeline.cli bench --preset gpt2 --artifacts "$artifacts" --run "$run" \
      --device cpu --backend ort-fused --precision int8 --batch "$batch" --prompt-tokens 128 --new-tokens 64 --repeats 3 \
      --sample --temperature 0.8 --top-p 0.95 2>&1) | grep -E "^\| ort-fused" |
      awk -v t="$name" -v r="$round" -F'|' '{print r, t, $5, "decode p50", $7, "tok/s", $11, "x greedy", $15}'
  done
done
