#!/usr/bin/env bash
# GPU call 1 of session 29 (2026-11-25) at commit 3701baf: split-KV combined in the last block,
# the softmax ping-pong (PINGPONG=2); their tests on the GPU, then the latency shape's variants,
# the decoding waterfall (combine kernel against the last block) and the S 512 timelines
# (full, and causal under the work queue).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=3701baf
timeout 230 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_causal_varlen.py -k "not compiles" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
tail -6 $OUT/pytest.log
timeout 330 python3 scripts/shape_map.py --parts latency waterfall timeline > $OUT/short.log 2>&1; echo "short rc=$?"
grep -v "stamps" $OUT/short.log | sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' | cut -c1-170
