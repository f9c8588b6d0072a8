#!/usr/bin/env bash
# GPU call 13 of session 40 (issue 25): stage 7 re-recorded with its work queue's tail order (call 12
# measured it, ran the tests and the sanitizers): fp8_tiles, fp8_bench, fp8_waterfall, and the stage 7
# and journey notebooks executed against the new record.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call13
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 200 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
if [ $tests_rc -eq 0 ]; then
  step tiles 200 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json; grep -E "recorded|FAIL" $L/tiles.log
  step fp8bench 200 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
  grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
  step waterfall 200 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; grep -E "recorded|FAIL" $L/waterfall.log
  for nb in stage7_fp8 journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log; done
fi
rm -f $L/nb-*.log
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage7_fp8.ipynb notebooks/journey.ipynb $L
