#!/usr/bin/env bash
# GPU call 3 of session 29 (2026-11-25) at commit 18b9a4f: the whole test suite on the GPU (the
# one-consumer rule moves many small shapes to new tiles; the S-ahead variants), then the D64
# short-prefill schedules with S a key tile ahead of its softmax.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=18b9a4f
timeout 260 python3 -m pytest -p no:cacheprovider -q -n 8 -x tests -k "not compiles" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "FAILED|Error|passed|failed" $OUT/pytest.log | tail -15
timeout 320 python3 scripts/shape_map.py --parts schedules --head-dims 64 > $OUT/schedules64.log 2>&1; echo "schedules rc=$?"
sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' $OUT/schedules64.log | cut -c1-135
