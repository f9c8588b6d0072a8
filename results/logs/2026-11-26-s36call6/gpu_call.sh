#!/usr/bin/env bash
# GPU call 6 of session 36 (issue 21): short prompts (S <= 2048, the map's prefill rows) as called
# against blocks of one consumer, two or three per SM (scripts/prefill_blocks_ab.py; logs only).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step prefill_blocks 400 python3 scripts/prefill_blocks_ab.py --out $OUT/logs/prefill_blocks.json
grep -E "^\[|variants|passed" $OUT/logs/prefill_blocks.log | cut -c1-400
