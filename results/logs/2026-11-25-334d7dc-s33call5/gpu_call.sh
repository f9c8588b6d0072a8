#!/usr/bin/env bash
# GPU call 5 of session 33 (2026-11-25) at 334d7dc: the stage 8 notebook executed against stage 6's
# new record (its banner names the stage rows it read; CI's consistency test failed it).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=334d7dc
timeout 200 python3 -m lib.notebook --execute notebooks/stage8_backward.ipynb > $OUT/nb-stage8_backward.log 2>&1; echo "stage8_backward rc=$?"
tail -2 $OUT/nb-stage8_backward.log | cut -c1-200
cp notebooks/stage8_backward.ipynb $OUT/
