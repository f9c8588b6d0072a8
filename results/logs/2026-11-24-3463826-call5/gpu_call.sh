#!/usr/bin/env bash
# GPU call 5 of session 28 (2026-11-24) at commit 3463826: the TMA-store epilogue for persistent
# launches; its tests (persistent launches with one or two Q buffers, with and without the TMA
# store, every schedule, decoding), then the timeline and the short-prefill launches (printed).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=3463826
timeout 170 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_causal_varlen.py -k "not compiles" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
tail -4 $OUT/pytest.log
timeout 360 python3 scripts/shape_map.py --parts timeline schedules > $OUT/short.log 2>&1; echo "short rc=$?"
grep -v "stamps" $OUT/short.log | sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' | cut -c1-150
