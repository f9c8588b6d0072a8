#!/usr/bin/env bash
# GPU call 3 of session 27 (2026-11-24) at commit 34772e9 (stage sources as in call 2): stages 0, 1,
# 2 re-recorded one by one (scripts/record_stages.sh; whichever fit in the call's time).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=34772e9
OUT=$OUT bash scripts/record_stages.sh 555 0 1 2
tar czf $OUT/run.tgz results README.md
