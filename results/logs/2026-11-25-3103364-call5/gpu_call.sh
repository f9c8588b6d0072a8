#!/usr/bin/env bash
# GPU call 5 of session 31 (2026-11-25) at commit 3103364: call 4 again: its notebooks' cells were split over xdist workers by --dist worksteal (NameErrors), now tests/ only (the notebooks are executed after the records); stage 6's HF refusal test moved to stage 4. The GPU suite, then stage 6's rows re-recorded.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=3103364
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step pytest 250 python3 -m pytest tests -q -p no:cacheprovider -n 8 --dist worksteal --deselect tests/test_freshness.py::test_recorded_results_match_current_sources; rc=$?
grep -E "passed|failed" $OUT/pytest.log | tail -2; grep -E "^FAILED|^E  " $OUT/pytest.log | head -20 | cut -c1-300
[ $rc -eq 0 ] || exit 1
step bench6 220 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A10 "^| stage | shape" $OUT/bench6.log | head -16
tar czf $OUT/run.tgz results notebooks README.md
