#!/usr/bin/env bash
# GPU call 2 of session 30 (2026-11-25) at commit e2242f0: stage 8's tests again (the
# gradient rule's cancellation term, the D 128 spill allowance), then stage 5 re-recorded (its
# forward now saves the log-sum-exp; its PTX helpers moved to stages/mma.cuh) and the tile sweep
# of stages 4 and 5 at today's sources.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=e2242f0
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py > $OUT/pytest-backward.log 2>&1; echo "pytest backward rc=$?"
grep -E "passed|failed|FAILED" $OUT/pytest-backward.log | head -20
OUT=$OUT bash scripts/record_stages.sh 140 5
grep -A8 "^| stage | shape" $OUT/bench-stage5.log | head -9
timeout 320 python3 scripts/tile_sweep.py --record > $OUT/tiles.log 2>&1; echo "tiles rc=$?"
grep -E "chosen|recorded|FAIL" $OUT/tiles.log | head -20 | cut -c1-200
tar czf $OUT/run.tgz results README.md
