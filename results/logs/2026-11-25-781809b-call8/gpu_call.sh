#!/usr/bin/env bash
# GPU call 8 of session 31 (2026-11-25) at commit 781809b: stage 8's backward record again (its launcher changed after call 10 of session 30), then the notebooks that read it executed: stage 8, the journey, the introduction.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=781809b
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step backward 250 python3 scripts/backward_bench.py --record --variants --rounds 5
grep -E "WGMMA without|^\| B" $OUT/backward.log | cut -c1-200 | head -30
for nb in stage8_backward journey 00_introduction; do step nb-$nb 130 python3 -m lib.notebook --execute notebooks/$nb.ipynb; done
tar czf $OUT/run.tgz results notebooks README.md
