#!/usr/bin/env bash
# GPU call 9 of session 41: the stage 6 notebook executed again after comment-only edits to
# stages/stage6.py (its source listing shows them); the record is the same (a2c9671's map).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call9
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step nb-stage6_wgmma_tma 200 python3 -m lib.notebook --execute notebooks/stage6_wgmma_tma.ipynb; tail -1 $L/nb-stage6_wgmma_tma.log
tar czf $OUT/run.tgz notebooks/stage6_wgmma_tma.ipynb $L
