#!/usr/bin/env bash
# GPU call 2 of session 39 (issue 25): stage 7 with ROW_SUM_MMA on by default at D64, each P·V's
# row sums now moved into l in fp32 (call 1's build let them grow in the accumulator and failed
# the emulation's RMSE rule at S 2048-8192). Stage 7's tests; the row sums against the build
# without, same rounds (rowsum_ab.py); compute-sanitizer on the row-sum launch paths; then the
# records (fp8_tiles, fp8_bench, fp8_waterfall) and the stage 7 and journey notebooks.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s39call2
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step pytest 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
step rowsum 150 python3 $here/rowsum_ab.py; grep -E "^B|Error" $L/rowsum.log
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 $here/row_sum_calls.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -1 $L/sanitize-$tool.log)"
done
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
