# What every sitting script here sources: the carried wheels installed (once a machine: a chain left
# running by xl_chain.sh imports from /tmp/site), the log in $OUT, and
# `step NAME SECONDS CMD...` (CMD bounded, its output and exit code logged as it comes).
set -u
[ -e /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=$OUT/log.txt
G="python3 -m pipeline.cli"
step() { local s=$(date +%s); echo "== $1" >> $L; timeout $2 "${@:3}" >> $L 2>&1; echo "== $1: rc $? in $(( $(date +%s) - s )) s" >> $L; }
wait_ready() { step "ready $1" $2 python3 -c "
import time, urllib.request
while True:
    try: urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2); break
    except Exception: time.sleep(1)"; }
# ready NAME SECONDS PATH PID: polls PATH until it answers, giving up when the server PID has exited
ready() { step "ready $1" $2 python3 -c "
import os, sys, time, urllib.request
while True:
    try: urllib.request.urlopen('http://127.0.0.1:8000$3', timeout=2); break
    except Exception: time.sleep(1)
    try: os.kill($4, 0)
    except OSError: sys.exit('the server exited')"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> $L
