#!/usr/bin/env bash
# GPU call 3 of session 31 (2026-11-25) at commit 0a60c0e: call 2 measured the carried P·V 5-14% slower
# at S 512-1024. The producer waited for the carried tile's Q buffer ahead of the second K; now it
# copies the next Q after the second K and V. The carried-P·V tests, then the schedules again.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=0a60c0e
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 --dist worksteal tests/test_stage6.py -k "carried or q_buffers or work_queue" > $OUT/pytest-stage6.log 2>&1; rc=$?; echo "pytest stage6 rc=$rc $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-stage6.log | head -12 | cut -c1-300
[ $rc -eq 0 ] || exit 1
t0=$(date +%s)
timeout 300 python3 scripts/shape_map.py --parts schedules --seqs 512 1024 --dtype bfloat16 > $OUT/schedules.log 2>&1; echo "schedules rc=$? $(( $(date +%s) - t0 )) s"
sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' $OUT/schedules.log | cut -c10-125
