#!/usr/bin/env bash
# GPU call 6 of session 42: stage 5's idea-by-idea record (scripts/stage5_ideas.py, last at ecef994,
# before stage 5's sources changed: its notebook marked it stale) re-recorded at stage 5's sources,
# then the stage 5 notebook executed against it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call6
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step stage5_ideas 400 python3 scripts/stage5_ideas.py --record
tail -n 25 $L/stage5_ideas.log | cut -c1-200
step nb-stage5_vectorized 150 python3 -m lib.notebook --execute notebooks/stage5_vectorized.ipynb; tail -1 $L/nb-stage5_vectorized.log
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage5_vectorized.ipynb $L
