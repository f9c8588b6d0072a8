#!/usr/bin/env bash
# GPU call 10 of session 36 (issue 21): at the D64 decode rows that run two blocks per SM, their
# ring two buffers deep (as called) against three, with the splits as called and twice them
# (scripts/decode_launch_ab.py; logs only).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step decode_launch 420 python3 scripts/decode_launch_ab.py --launch rings --out $OUT/logs/decode_launch.json
grep -E "^\[|variants|passed" $OUT/logs/decode_launch.log | sed -E 's/ \(([0-9.]+x)\)/ \1/g' | cut -c1-400
