#!/usr/bin/env bash
# GPU call 4 of 2026-11-24 at commit a4cec07: the stage 6 notebook executed against the fd94088
# record (its SASS table failed in call 3 under NVRTC 13.0: fixed in lib.notebook).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=a4cec07
timeout 300 python3 -m lib.notebook --execute notebooks/stage6_wgmma_tma.ipynb > $OUT/notebooks.log 2>&1; echo "rc=$?"
grep -v IPKernelApp $OUT/notebooks.log | tail -15 | cut -c1-400
cp notebooks/stage6_wgmma_tma.ipynb $OUT/
