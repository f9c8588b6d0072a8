#!/usr/bin/env bash
# GPU call 1 of session 28 (2026-11-24) at commit 72182d2: stage 6 with two Q buffers (Q_STAGES):
# its tests (every schedule, the Q buffers on persistent launches, decoding, grad refusal), then
# the short-prefill launches measured (shape_map.py --parts timeline schedules, printed only)
# to pick the rule for S 512-2048.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=72182d2
timeout 170 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_causal_varlen.py -k "not compiles" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
tail -4 $OUT/pytest.log
timeout 400 python3 scripts/shape_map.py --parts timeline schedules > $OUT/short.log 2>&1; echo "short rc=$?"
grep -v "^\[\|stamps" $OUT/short.log | tail -8
