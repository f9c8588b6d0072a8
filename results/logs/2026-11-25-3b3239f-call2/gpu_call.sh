#!/usr/bin/env bash
# GPU call 2 of session 31 (2026-11-25) at commit 3b3239f: call 1's stage 6 tests ran out of time
# (the carried P·V with one Q buffer and the TMA store deadlocked; now refused). Stage 6's GPU
# tests again (work stealing, so no test waits behind a slow one), then the short-prefill
# schedules at S 512 and 1024 with the carry on and off.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=3b3239f
t0=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 8 --dist worksteal tests/test_stage6.py > $OUT/pytest-stage6.log 2>&1; rc=$?; echo "pytest stage6 rc=$rc $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-stage6.log | head -12 | cut -c1-300
[ $rc -eq 0 ] || exit 1
t0=$(date +%s)
timeout 300 python3 scripts/shape_map.py --parts schedules --seqs 512 1024 --dtype bfloat16 > $OUT/schedules.log 2>&1; echo "schedules rc=$? $(( $(date +%s) - t0 )) s"
sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' $OUT/schedules.log | cut -c1-140
