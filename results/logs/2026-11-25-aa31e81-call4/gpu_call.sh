#!/usr/bin/env bash
# GPU call 4 of session 30 (2026-11-25) at commit aa31e81: stage 8's builds checked (every tile choice,
# dQ by atomics and by its own pass) and timed against SDPA's backward in interleaved rounds
# (not recorded: this picks the stage's defaults).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=aa31e81
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py > $OUT/pytest-backward.log 2>&1; echo "pytest backward rc=$?"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-backward.log | head -20 | cut -c1-300
timeout 400 python3 scripts/backward_bench.py --variants --rounds 3 > $OUT/backward.log 2>&1; echo "backward bench rc=$?"
grep -vE "^   check" $OUT/backward.log | cut -c1-220
