#!/usr/bin/env bash
# GPU call 8 of session 27 (2026-11-24) at commit 95bd4e8: the notebooks that read stages 4-6
# executed against the final records (stage 4, 5, 6 notebooks, the journey, the introduction).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=95bd4e8
for nb in stage4_large_tiles stage5_vectorized stage6_wgmma_tma journey 00_introduction; do
  timeout 130 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz notebooks
