#!/usr/bin/env bash
# GPU call 2 of session 43: TAIL_SPLIT timed again, each round in the order split, whole, whole,
# split (call 1's pairs beside stage 6 moved 7-9% with their place in the round); then stage 7's
# records at these sources (fp8_tiles, fp8_bench with the unsplit kernel beside, fp8_waterfall
# with the split as its last step) and the stage 7 notebook executed against them.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call2
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step ab 240 python3 scripts/tail_split_ab.py --out $L/tail_split_ab.json
grep -E "^B" $L/ab.log | cut -c1-420
step tiles 120 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json; grep -E "recorded|FAIL" $L/tiles.log
step fp8bench 120 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
step waterfall 120 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; grep -E "recorded|FAIL" $L/waterfall.log
left=$(( 590 - ($(date +%s) - T0) ))
step nb-stage7 $left python3 -m lib.notebook --execute notebooks/stage7_fp8.ipynb; tail -1 $L/nb-stage7.log
tar czf $OUT/run.tgz results/*.json notebooks/stage7_fp8.ipynb $L
