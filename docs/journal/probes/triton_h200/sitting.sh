#!/usr/bin/env bash
# Triton Inference Server on one H200 (#52), then the sampler again (#48), carrying .whl and .tw:
# .tw holds numpy 1.26 and ml_dtypes 0.5 for CPython 3.12 (the Python backend stub needs numpy 1) and
# nvidia-pytriton 0.7.0 cut down to its tritonserver, Python backend, the 3.12 stub and their libraries
# (pytriton-slim.tar.xz: pytriton/__init__.py, pytriton/tritonserver/{bin,backends,caches,
# python_backend_stubs/3.12} and nvidia_pytriton.libs without libpython3.13, from the wheel). The
# machine's scipy is built for numpy 2: scipy 1.13.1 (cp312, 38 MB) comes too, by a call before this one
# that carries .tw2 and runs `mkdir -p /tmp/parts && cp .tw2/*.whl /tmp/parts/` (docs/journal/performance.md,
# "Triton Inference Server on one H200").
# The generation model with the triton backend inside, then `gpt2-deploy serve` on the same run, each
# measured with streaming loads at 1 and 64 clients; with SAMPLER=1 the sampled and mixed serve loads,
# the sampler alone and the offline bench too (the first sitting ran them, the second not).
. "$(dirname "$0")/../shapes_h200/sitting.sh"
R="--preset gpt2 --run tr"
python3 -m venv /tmp/tenv && /tmp/tenv/bin/python -m pip install -q --no-index --no-deps .tw/*.whl $(ls /tmp/parts/*.whl 2>/dev/null)
# the machine's packages (its user site too, which a venv leaves out) after the venv's own numpy 1
python3 -c "import site; print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in [*site.getsitepackages(), site.getusersitepackages()]))" \
  > "$(/tmp/tenv/bin/python -c 'import site; print(site.getsitepackages()[0])')/machine.pth"
mkdir -p /tmp/tsite && tar -C /tmp/tsite -xJf .tw/pytriton-slim.tar.xz
ls "$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"/libpython3* >> $L 2>&1
TP="env PYTHONPATH=/tmp/site:/tmp/tsite:$PWD /tmp/tenv/bin/python"
LT="$G loadtest http://127.0.0.1:8000 --duration 8 --warmup 3"
ready() { step "ready $1" $2 python3 -c "
import time, urllib.request
while True:
    try: urllib.request.urlopen('http://127.0.0.1:8000$3', timeout=2); break
    except Exception: time.sleep(1)"; }
step finetune 120 $G finetune $R --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false
step package 120 $G package $R --backend triton --precision fp16 --device cuda
$TP -m pipeline.cli triton-server artifacts/tr/triton > /tmp/triton.log 2>&1 &
TS=$!
ready triton 240 /v2/health/ready
step "triton greedy" 60 $LT --concurrency 1,64 --triton-model gpt2 --out /tmp/t_greedy
step "triton sampled" 60 $LT --concurrency 64 --temperature 0.8 --top-p 0.95 --triton-model gpt2 --out /tmp/t_sampled
kill -INT $TS; wait $TS; echo "== triton exit $?" >> $L
grep -a -E "error|Error|READY|UNAVAILABLE" /tmp/triton.log | head -20 >> $L
$G serve $R --device cuda --backend triton --precision fp16 > /tmp/serve.log 2>&1 &
SP=$!
ready serve 120 /ready
step "serve greedy" 60 $LT --concurrency 1,64 --out /tmp/s_greedy
[ -n "${SAMPLER:-}" ] && step "serve sampled" 60 $LT --concurrency 1,64 --temperature 0.8 --top-p 0.95 --out /tmp/s_sampled
[ -n "${SAMPLER:-}" ] && step "serve mixed" 60 $LT --concurrency 64 --temperature 0.8 --top-p 0.95 --sampled-share 0.5 --spread 0.9 --out /tmp/s_mixed
kill -INT $SP; wait $SP
[ -n "${SAMPLER:-}" ] && step timing 120 python3 docs/journal/probes/sampling_h200/sampler_timing.py
[ -n "${SAMPLER:-}" ] && step bench 150 $G bench $R --device cuda --backend triton --precision fp16 --sample --batch 1,8,64 --repeats 2
cp artifacts/tr/reports/bench.json $OUT/bench.json 2>/dev/null
for n in t_greedy t_sampled s_greedy s_sampled s_mixed; do cp /tmp/$n/loadtest.json $OUT/loadtest_$n.json; done
grep -E "^==|^sampler|^loadtest|rc [1-9]|rror|libpython" $L
