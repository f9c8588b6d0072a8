#!/usr/bin/env bash
# GPU call 8 of session 29 (2026-11-25) at commit fde1bf8: the tile sweep of stages 4 and 5 recorded at
# today's sources (the last one, 8b8fa98, measured older sources of both), then the two notebooks
# that read it executed (each says whether its stage's default tile is the fastest measured).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=fde1bf8
timeout 330 python3 scripts/tile_sweep.py --record > $OUT/tiles.log 2>&1; echo "tiles rc=$?"
tail -45 $OUT/tiles.log | cut -c1-160
for nb in stage4_large_tiles stage5_vectorized; do
  timeout 90 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz results notebooks/stage4_large_tiles.ipynb notebooks/stage5_vectorized.ipynb
