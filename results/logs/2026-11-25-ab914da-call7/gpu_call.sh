#!/usr/bin/env bash
# GPU call 7 of session 31 (2026-11-25) at commit ab914da: stage 5's epilogue race fixed (block barrier): its tests and the new stress test of rows without keys, compute-sanitizer memcheck/racecheck/synccheck on stage 5 (blocks without key tiles) and on every stage 6 launch path with the new code (the carried P·V switched on, the log-sum-exp output), then stage 5 re-recorded.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=ab914da
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step pytest 150 python3 -m pytest tests/test_causal_varlen.py tests/test_stages.py tests/test_backward.py -q -p no:cacheprovider -n 8 --dist worksteal; rc=$?
grep -E "passed|failed" $OUT/pytest.log | tail -2; grep -E "^FAILED|^E  " $OUT/pytest.log | head -20 | cut -c1-300
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 110 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $(dirname $0)/calls.py; tail -n 2 $OUT/sanitize-$tool.log
done
OUT=$OUT bash scripts/record_stages.sh 140 5
grep -A8 "^| stage | shape" $OUT/bench-stage5.log | head -9
tar czf $OUT/run.tgz results notebooks README.md
