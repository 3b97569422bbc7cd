#!/usr/bin/env bash
# gpt2-large's fp16 TensorRT-RTX plan on a 2-core CPU with 24 GB (#50): a 1-step fine-tune on the
# CPU (random init), the portable fp16 graph (fp32 first, then ModelOpt AutoCast with one
# calibration sample), the sm89 plan. Each step's peak resident memory from /usr/bin/time.
# Run from the repository root after `make install`.
set -u
G=".venv/bin/gpt2-deploy"
R="--preset gpt2-large --run largecpu"
FT="--set train.device=cpu --set train.batch_size=1 --set train.steps=1 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
s() { local t=$(date +%s); echo "== $1"; /usr/bin/time -f "peak %M KB" "${@:2}" 2>&1 | grep -v "it/s\]" | tail -4; echo "== $1: rc ${PIPESTATUS[0]} in $(( $(date +%s) - t )) s"; }
s finetune $G finetune $R $FT
s "export fp16" $G export $R --target portable --precision fp16
s "build fp16" $G build-engine $R --precision fp16 --flavour tensorrt_rtx --target sm89
# then the int8 (Q/DQ) graph and its plan: ModelOpt's calibration of the default 64 held-out blocks
# was killed for memory here, 8 fit
s "export int8" $G export $R --target portable --precision int8 --set data.calib_samples=8
s "build int8" $G build-engine $R --precision int8 --flavour tensorrt_rtx --target sm89
