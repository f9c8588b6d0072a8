#!/usr/bin/env bash
# GPU call 3 of session 43: scripts/queue_tail_probe.py — which SM ran each of stage 7's work
# tiles and when, at issue 25's two standard shapes (full attention, the work queue): why splitting
# the queue's last partial wave (call 2) saved about 0.4% where 2-3% was predicted.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call3
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step probe 240 python3 scripts/queue_tail_probe.py --out $L/queue_tail.json --shape 4 16 8192 128 --shape 16 16 2048 64 --shape 2 16 8192 128 --shape 3 16 8192 128
cat $L/probe.log | cut -c1-600
tar czf $OUT/run.tgz $L
