#!/usr/bin/env bash
# GPU call 5 of session 38 (issue 25): stage 7 with a lazy rescale (LAZY_RESCALE k > 0, P's offset
# 8 − k), with and without ping-pong, against the default in the same rounds (lazy_ab.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
here=results/logs/2026-11-26-s38call5
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step lazy 300 python3 $here/lazy_ab.py; grep -E "^B|Error" $OUT/logs/lazy.log
