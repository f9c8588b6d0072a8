#!/usr/bin/env bash
# GPU call 11 of session 31 (2026-11-25) at commit 9a89c0d: call 10's shape map stopped after 143 of 145 rows (140 kept): finished with --resume, then the stage 6 notebook and the journey executed on it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=9a89c0d
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step shape_map 150 python3 scripts/shape_map.py --record --dtype bfloat16 --resume
tail -n 6 $OUT/shape_map.log | cut -c1-200
for nb in stage6_wgmma_tma journey; do step nb-$nb 100 python3 -m lib.notebook --execute notebooks/$nb.ipynb; done
tar czf $OUT/run.tgz results notebooks README.md
