#!/usr/bin/env bash
# GPU call 7 of session 38 (issue 25, item 5): stage 7's schedule waterfall recorded
# (scripts/fp8_waterfall.py --record), then the stage 7 notebook, which draws it. Stage 7's sources
# are those of call 6's record (8d88528).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s38call7
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step waterfall 300 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; rc=$?
grep -E "^B|^  stage|recorded|FAIL|Error" $L/waterfall.log | cut -c1-200
if [ $rc -eq 0 ]; then step nb-stage7_fp8 200 python3 -m lib.notebook --execute notebooks/stage7_fp8.ipynb; tail -1 $L/nb-stage7_fp8.log; fi
rm -f $L/nb-*.log
tar czf $OUT/run.tgz results/*.json notebooks/stage7_fp8.ipynb $L
