#!/usr/bin/env bash
# GPU call 6 of session 33 (2026-11-25) at bf49b28: lib/fp8.py (one of stage 7's sources) changed in
# review, so stage 7's tests run again, its benchmark is re-recorded, and its notebook re-executed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=bf49b28
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step fp8tests 150 python3 -m pytest -q -rf "${par[@]}" tests/test_stage7.py || exit 1
grep -E "passed|failed" $OUT/fp8tests.log | tail -1
step fp8bench 200 python3 scripts/fp8_bench.py --record --out $OUT/fp8_bench.json || exit 1
grep -E "^\| B|ceilings|recorded|FAIL" $OUT/fp8bench.log | cut -c1-200
step nb-stage7_fp8 150 python3 -m lib.notebook --execute notebooks/stage7_fp8.ipynb; tail -1 $OUT/nb-stage7_fp8.log
cp notebooks/stage7_fp8.ipynb results/nvidia-h100-80gb-hbm3.json $OUT/
