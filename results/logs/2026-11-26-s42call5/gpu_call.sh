#!/usr/bin/env bash
# GPU call 5 of session 42: after the re-records of calls 2-4 (stage 6, the training record, the
# shape map, stage 7, the schedule record, generate()), every notebook that reads them, executed:
# stage 8, stage 6, journey, the introduction, stage 7.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

for nb in stage8_backward stage6_wgmma_tma journey 00_introduction stage7_fp8; do
  step nb-$nb 200 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log
done
tar czf $OUT/run.tgz results/*.json results/*.png notebooks $L
