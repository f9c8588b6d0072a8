#!/usr/bin/env bash
# GPU call 5 of session 44: the shape map (bf16) again, with SKIP_ROWS_PAST_END and lib.timing's
# settled batches and rotated rounds (every prefill, decoding and waterfall row).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
left=$(( 585 - ($(date +%s) - T0) ))
step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $L/shape_map.log | cut -c1-200
tar czf $OUT/run.tgz results/*.json results/*.png README.md $L
