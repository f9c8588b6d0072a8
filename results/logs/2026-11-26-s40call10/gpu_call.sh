#!/usr/bin/env bash
# GPU call 10 of session 40 (issue 21): stage 6 re-recorded with the work queue handing its last two
# waves of causal work tiles out longest first (TAIL_WAVES = 2; call 9 measured it and ran the
# tests and sanitizers on these kernels): its standard rows (lib.bench, fp16 and bf16) and the
# shape map (bf16).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call10
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step bench 150 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A8 "^| stage | shape | dtype | causal | µs" $L/bench.log | head -10 | cut -c1-200; tail -1 $L/bench.log | cut -c1-250
left=$(( 575 - ($(date +%s) - T0) ))
echo "shape map: $left s left"
step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $L/shape_map.log | cut -c1-200
tar czf $OUT/run.tgz results README.md $L
