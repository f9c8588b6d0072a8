#!/usr/bin/env bash
# GPU call 4 of session 28 (2026-11-24) at commit 8f1ecaa: block 0's timeline at S 512 with the
# producer's waits stamped, at 2- and 4-deep rings (printed only).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=8f1ecaa
timeout 200 python3 scripts/shape_map.py --parts timeline > $OUT/timeline.log 2>&1; echo "timeline rc=$?"
grep -v "stamps" $OUT/timeline.log | cut -c1-200
