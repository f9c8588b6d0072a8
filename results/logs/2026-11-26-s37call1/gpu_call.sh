#!/usr/bin/env bash
# GPU call 1 of session 37 (issue 23): stage 8 with three one-warpgroup blocks per SM at D 64
# (BLOCKS_PER_SM 3, without the overlap, one buffer of dQ tiles). Stage 8's tests,
# compute-sanitizer on the new build, then every WGMMA variant in bf16 in the same rounds (not
# recorded: an experiment).
set -u
L=results/logs/2026-11-26-s37call1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_backward.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
if [ $tests_rc -eq 0 ]; then
  step backward 200 python3 scripts/backward_bench.py --variants wgmma --dtype bfloat16 --rounds 5
  grep -E "^bfloat16|3 blocks|without overlap  " $OUT/logs/backward.log | cut -c1-220
fi
