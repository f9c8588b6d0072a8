#!/usr/bin/env bash
# GPU call 2 of session 33 (2026-11-25) at 4e746b2: stage 7 against the emulation that rounds P as
# the kernel does (probe, tests, then its benchmark recorded if every check passes, then the
# sanitizers at small shapes); then stage 6's shape map re-recorded at its new split rules (issue
# 21) with what time is left (--resume in the next call finishes it).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=4e746b2
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step fp8probe 60 python3 scripts/fp8_loop_probe.py; cut -c1-260 $OUT/fp8probe.log | tail -4
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step fp8tests 150 python3 -m pytest -q -rf -s "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/fp8tests.log | cut -c1-240 | head -20
grep -oE "vs emulation: worst element [0-9.]+ of its bound, RMSE [0-9.]+" $OUT/fp8tests.log | awk '{w=$5; r=$10; if (w>mw) mw=w; if (r>mr) mr=r} END {print "over", NR, "checks: worst element", mw, "of its bound; worst RMSE", mr, "of its allowance"}'
if [ $tests_rc -eq 0 ]; then
  step fp8bench 200 python3 scripts/fp8_bench.py --record --out $OUT/fp8_bench.json; grep -E "^\||ceilings|recorded|FAIL" $OUT/fp8bench.log | cut -c1-260
fi
for tool in memcheck racecheck synccheck; do
  step fp8-sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m pytest -x -q -p no:cacheprovider tests/test_stage7.py -k sanitizers
  grep -E "ERROR SUMMARY|passed|failed" $OUT/fp8-sanitize-$tool.log | head -3
done
left=$(( 560 - ($(date +%s) - T0) ))
echo "shape map: $left s left"
[ $left -gt 30 ] && step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $OUT/shape_map.log | cut -c1-200
tar czf $OUT/run.tgz results
