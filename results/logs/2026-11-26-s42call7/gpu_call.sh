#!/usr/bin/env bash
# GPU call 7 of session 42: the tile sweep of stages 4 and 5 (scripts/tile_sweep.py, last at e2242f0,
# before stage 5's sources changed: its notebook marked it stale) re-recorded at their sources, then
# the stage 4 and stage 5 notebooks executed against it (each checks its stage's tiles against it).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call7
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tiles 400 python3 scripts/tile_sweep.py --record
grep -E "recorded|FAIL|fastest|chosen" $L/tiles.log | head -20 | cut -c1-200
for nb in stage4_large_tiles stage5_vectorized; do
  step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log
done
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage4_large_tiles.ipynb notebooks/stage5_vectorized.ipynb $L
