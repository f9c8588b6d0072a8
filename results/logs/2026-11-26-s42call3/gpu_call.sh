#!/usr/bin/env bash
# GPU call 3 of session 42: stage 7 re-recorded after its work queue's order moved to
# stages/work_queue.cuh (SASS unchanged): its tests, then fp8_tiles, fp8_bench and fp8_waterfall;
# and stage 6's whole test file on the H100 (call 2 re-recorded it).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call3
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest7 120 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest7.log | cut -c1-240 | head -8
if [ $tests_rc -eq 0 ]; then
  step tiles 150 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json; grep -E "recorded|FAIL" $L/tiles.log
  step fp8bench 150 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
  grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
  step waterfall 150 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; grep -E "recorded|FAIL" $L/waterfall.log
fi
left=$(( 580 - ($(date +%s) - T0) ))
echo "stage 6 tests: $left s left"
step pytest6 $left python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py
grep -E "passed|failed|^FAILED" $L/pytest6.log | cut -c1-240 | head -8
tar czf $OUT/run.tgz results/*.json results/*.png $L
