#!/usr/bin/env bash
# GPU call 3 of session 39 (issues 25, 21): stage 7 with the row sums by P·V only where three
# consumers share an SM (128-key tiles: the D64 default; call 2 found them 0.97x at B1 H8 S512,
# one consumer per block). Stage 7's tests; D64 ring depths and Q buffers with the row sums
# (d64_tiles_ab.py); stage 6's short causal tiles against other rings and 64-key tiles at issue
# 21's four rows under 0.95x (s6_short_causal_ab.py, stage 6 unchanged); then stage 7's records
# (fp8_tiles, fp8_bench, fp8_waterfall) and the stage 7 and journey notebooks.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s39call3
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step pytest 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
step d64tiles 120 python3 $here/d64_tiles_ab.py; grep -E "^B|Error" $L/d64tiles.log
step s6short 150 python3 $here/s6_short_causal_ab.py; grep -E "^B|Error" $L/s6short.log
if [ $tests_rc -eq 0 ]; then
  step tiles 300 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json
  grep -E "^\| B|recorded|FAIL" $L/tiles.log | cut -c1-200
  step fp8bench 300 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
  grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
  step waterfall 300 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json
  grep -E "^B|^  stage|recorded|FAIL" $L/waterfall.log | cut -c1-200
  for nb in stage7_fp8 journey; do step nb-$nb 200 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log; done
fi
rm -f $L/nb-*.log
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage7_fp8.ipynb notebooks/journey.ipynb $L
