#!/usr/bin/env bash
# GPU call 4 of session 27 (2026-11-24) at commit fa39750 (stage sources as in calls 2-3; the results
# file now holds call 3's stages 0 and 1): stages 2, 3, 4, 5 re-recorded one by one.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=fa39750
OUT=$OUT bash scripts/record_stages.sh 560 2 3 4 5
tar czf $OUT/run.tgz results README.md
