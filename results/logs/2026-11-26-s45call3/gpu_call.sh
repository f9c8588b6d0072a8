#!/usr/bin/env bash
# GPU call 3 of session 45: stages 5 and 1 re-recorded with settled timing (the last two of
# stages 0-5; calls 1-2 did 0, 2, 3, 4), then, in the time left, the notebooks that show the
# README table's medians executed against the new records: journey, introduction, stage 6, then
# the stage notebooks whose rows changed.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s45call3
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
OUT=$L bash scripts/record_stages.sh 345 5 1
for nb in journey 00_introduction stage6_wgmma_tma stage5_vectorized stage4_large_tiles stage3_warp_softmax stage2_fused stage1_unfused_wmma stage0_scalar; do
  left=$(( 570 - ($(date +%s) - T0) ))
  [ $left -lt 40 ] && { echo "$nb not run: $left s left"; continue; }
  t0=$(date +%s); timeout $left python3 -m lib.notebook --execute notebooks/$nb.ipynb > $L/nb-$nb.log 2>&1
  echo "nb-$nb rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $L/nb-$nb.log | cut -c1-200
done
tar czf $OUT/run.tgz results/*.json results/*.png README.md notebooks $L
