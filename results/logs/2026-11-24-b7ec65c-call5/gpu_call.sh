#!/usr/bin/env bash
# GPU call 5 of 2026-11-24 at commit b7ec65c (printed, not recorded): stage 6's schedules at short
# prefill (one block per work tile against persistent blocks), and the decoding waterfall with the
# new combine kernel.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=b7ec65c
timeout 400 python3 scripts/shape_map.py --parts schedules waterfall > $OUT/shapemap.log 2>&1; echo "rc=$?"
cut -c1-200 $OUT/shapemap.log | sed 's/^\[[0-9/]*, ~[0-9]* s left\] //'
