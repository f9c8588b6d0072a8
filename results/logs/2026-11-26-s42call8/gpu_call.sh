#!/usr/bin/env bash
# GPU call 8 of session 42: stage 5's tile choices in the same interleaved rounds
# (scripts/tile_sweep.py --interleaved), at both head dims' standard shapes: call 7's sweep, which
# times the variants one after another, put (128, 32, 2, 32) 2-4% ahead of the chosen D128 tiles,
# less than the chosen tiles' own run-to-run movement. Logs only: nothing is recorded.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call8
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tiles5 400 python3 scripts/tile_sweep.py --stages 5 --interleaved --out $L/tiles5_interleaved.json
grep -E "stage 5|interleaved|FAIL" $L/tiles5.log | cut -c1-200
tar czf $OUT/run.tgz $L
