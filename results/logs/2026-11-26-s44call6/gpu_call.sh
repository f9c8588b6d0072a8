#!/usr/bin/env bash
# GPU call 6 of session 44: stage 6's schedule waterfall and the generate() record again, with
# SKIP_ROWS_PAST_END and lib.timing's settled batches and rotated rounds.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call6
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step schedules 360 python3 scripts/stage6_schedules.py --record
tail -n 3 $L/schedules.log | cut -c1-200
left=$(( 580 - ($(date +%s) - T0) ))
echo "generate: $left s left"
[ $left -gt 60 ] && { step generate $left python3 scripts/generate_record.py --record; tail -n 3 $L/generate.log | cut -c1-200; }
tar czf $OUT/run.tgz results/*.json results/*.png README.md $L
