#!/usr/bin/env bash
# GPU call 4 of session 29 (2026-11-25) at commit b58a8e4: the whole test suite on the GPU, then the
# D128 short-prefill schedules with the work queue's new producer registers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=b58a8e4
timeout 330 python3 -m pytest -p no:cacheprovider -q -n 8 tests -k "not compiles" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" $OUT/pytest.log | tail -15
timeout 240 python3 scripts/shape_map.py --parts schedules --head-dims 128 > $OUT/schedules128.log 2>&1; echo "schedules rc=$?"
sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' $OUT/schedules128.log | cut -c1-135
