#!/usr/bin/env bash
# GPU call 6 of session 30 (2026-11-25) at commit 6f828ab: stage 8's WGMMA build checked (tests/test_backward.py)
# and timed with the mma.sync builds against SDPA's backward (not recorded).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=6f828ab
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py > $OUT/pytest-backward.log 2>&1; echo "pytest backward rc=$?"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-backward.log | head -20 | cut -c1-300
timeout 300 python3 scripts/backward_bench.py --variants --rounds 3 > $OUT/backward.log 2>&1; echo "backward bench rc=$?"
grep -vE "^   check|Warning|return Variable" $OUT/backward.log | cut -c1-220
