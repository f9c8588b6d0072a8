#!/usr/bin/env bash
# GPU call 1 of session 46: land session 45's re-record of stages 0-5 — execute the notebooks that
# read those rows and still show the old ones (python3 -m lib.notebook --stale: stage0-4, 7, 8),
# one at a time under a deadline, then list what is still stale.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-27-s46call1
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for nb in $(python3 -m lib.notebook --stale 2> /dev/null); do
  name=$(basename $nb .ipynb)
  left=$(( 560 - ($(date +%s) - T0) ))
  [ $left -lt 40 ] && { echo "$name not run: $left s left"; continue; }
  t0=$(date +%s); timeout $left python3 -m lib.notebook --execute $nb > $L/nb-$name.log 2>&1
  echo "nb-$name rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $L/nb-$name.log | cut -c1-200
done
echo "still stale:"; python3 -m lib.notebook --stale 2>&1 | sed 's/^/  /'
tar czf $OUT/run.tgz notebooks $L
