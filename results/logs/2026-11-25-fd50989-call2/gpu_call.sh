#!/usr/bin/env bash
# GPU call 2 of session 29 (2026-11-25) at commit fd50989: the short-prefill schedules (the softmax
# ping-pong among them) and the latency shapes (B1 H8 S512, D64 and D128) with fewer consumers
# per block and key splits.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=fd50989
timeout 150 python3 scripts/shape_map.py --parts latency > $OUT/latency.log 2>&1; echo "latency rc=$?"
timeout 420 python3 scripts/shape_map.py --parts schedules > $OUT/schedules.log 2>&1; echo "schedules rc=$?"
cat $OUT/latency.log $OUT/schedules.log | sed 's/^\[[0-9/]*, ~[0-9]* s left\] //' | cut -c1-150
