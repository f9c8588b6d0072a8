#!/usr/bin/env bash
# GPU call 10 of session 39 (issue 25): stage 7's attention kernel launched with PDL only where
# each block has one work tile (stage7.kernel_pdl; call 9: the whole call at D128 S8192 ran
# 0.94-0.98x with it, B1 H8 S512 1.13-1.17x); the cast always. Stage 7's tests; compute-sanitizer
# on the quantization; PDL against none, same rounds (call 8's pdl_ab.py); then, if the whole
# call was not slower with it, stage 7's records and notebooks.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s39call10
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step pytest 200 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  for calls in results/logs/2026-11-26-s37call6/calls.py; do
    n=$(basename $(dirname $calls))
    step sanitize-$tool-$n 100 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 $calls
    echo "  $(grep -h 'calls done' $L/sanitize-$tool-$n.log | head -1) / $(tail -1 $L/sanitize-$tool-$n.log)"
  done
done
step pdl 150 python3 results/logs/2026-11-26-s39call8/pdl_ab.py; grep -E "^B|^whole|RECORD|Error" $L/pdl.log
if [ $tests_rc -eq 0 ] && grep -qx RECORD $L/pdl.log; then
  step tiles 200 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json; grep -E "recorded|FAIL" $L/tiles.log
  step fp8bench 200 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
  grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
  step waterfall 200 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; grep -E "recorded|FAIL" $L/waterfall.log
  for nb in stage7_fp8 journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log; done
fi
rm -f $L/nb-*.log
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage7_fp8.ipynb notebooks/journey.ipynb $L
