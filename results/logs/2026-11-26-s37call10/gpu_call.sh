#!/usr/bin/env bash
# GPU call 10 of session 37 (issue 25): stage 7 re-recorded after one change to its sources:
# stage7.quantize takes PyTorch's path when batch·K/V heads exceed a grid's y (65,535), where
# its kernels could not launch. Stage 7's tests (that case included), compute-sanitizer, the FP8
# record, and the stage 7 and journey notebooks executed against it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 results/logs/2026-11-26-s37call6/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
if [ $tests_rc -eq 0 ]; then
  step fp8bench 240 python3 scripts/fp8_bench.py --record --out $OUT/logs/fp8_bench.json
  grep -E "^\| B|^B|ceilings|recorded|FAIL" $OUT/logs/fp8bench.log | cut -c1-250
  for nb in stage7_fp8 journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
fi
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage7_fp8.ipynb notebooks/journey.ipynb
rm -f $OUT/logs/nb-*.log
