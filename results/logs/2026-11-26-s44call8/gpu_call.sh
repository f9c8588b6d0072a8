#!/usr/bin/env bash
# GPU call 8 of session 44: stage 7's key-tile record again with the settled timing (its sources
# changed with SKIP_ROWS_PAST_END), stage 7's bench once more without recording (a second sample of
# the 1.5x at D128 that call 4 recorded), then the stage 7 notebook against the records.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call8
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tiles 180 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json; grep -E "recorded|FAIL" $L/tiles.log
step fp8bench-again 120 python3 scripts/fp8_bench.py --out $L/fp8_bench_again.json
grep -E "^\| B|ceilings|FAIL" $L/fp8bench-again.log | cut -c1-300
step nb-stage7_fp8 120 python3 -m lib.notebook --execute notebooks/stage7_fp8.ipynb; tail -1 $L/nb-stage7_fp8.log
tar czf $OUT/run.tgz results/*.json results/*.png notebooks $L
