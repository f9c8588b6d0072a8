#!/usr/bin/env bash
# GPU call 9 of session 31 (2026-11-25) at commit 781809b: the stage 5 and stage 6 notebooks executed on their new records (stage 5 re-recorded in call 7, stage 6 in call 6).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=781809b
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
for nb in stage5_vectorized stage6_wgmma_tma; do step nb-$nb 170 python3 -m lib.notebook --execute notebooks/$nb.ipynb; done
tar czf $OUT/run.tgz results notebooks README.md
