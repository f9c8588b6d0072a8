#!/usr/bin/env bash
# GPU call 4 of session 33 (2026-11-25) at d136b72: the stage 7 notebook executed on the H100
# (call 3 failed it on a missing import), with its GPU check of section 7.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=d136b72
timeout 150 python3 -m lib.notebook --execute notebooks/stage7_fp8.ipynb > $OUT/nb-stage7_fp8.log 2>&1; echo "stage7_fp8 rc=$?"
tail -3 $OUT/nb-stage7_fp8.log | cut -c1-200
cp notebooks/stage7_fp8.ipynb $OUT/
