#!/usr/bin/env bash
# GPU call 8 of 2026-11-24 at commit 2719d07: the notebooks that read stage 6 executed against the
# dc99aa6 record and shape map (stage 6, journey, introduction), each copied out when done.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=2719d07
for nb in stage6_wgmma_tma journey 00_introduction; do
  timeout 200 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
  cp notebooks/$nb.ipynb $OUT/
done
grep -v IPKernelApp $OUT/notebooks.log | tail -6 | cut -c1-300
