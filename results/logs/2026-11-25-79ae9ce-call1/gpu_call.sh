#!/usr/bin/env bash
# GPU call 1 of session 30 (2026-11-25) at commit 79ae9ce: stage 8's first kernel checked
# (tests/test_backward.py, the stage 5 and Hugging Face suites), its backward timed against
# SDPA's (not recorded yet), and stage 4 re-recorded with its new default tiles.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=79ae9ce
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py tests/test_hf.py > $OUT/pytest-backward.log 2>&1; echo "pytest backward+hf rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/pytest-backward.log | head -30
timeout 150 python3 scripts/backward_bench.py > $OUT/backward.log 2>&1; echo "backward bench rc=$?"
tail -22 $OUT/backward.log | cut -c1-250
OUT=$OUT bash scripts/record_stages.sh 160 4
grep -A12 "^| stage | shape" $OUT/bench-stage4.log | head -14
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_stages.py -k "5 or 4 or grad" > $OUT/pytest-stages.log 2>&1; echo "pytest stages rc=$?"
grep -E "passed|failed|FAILED" $OUT/pytest-stages.log | head -20
tar czf $OUT/run.tgz results README.md
