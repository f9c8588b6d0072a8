#!/usr/bin/env bash
# GPU call 4 of session 36 (issue 21): stage 6 decoding with two blocks per SM where its blocks
# fill the GPU (shares_sms): stage 6's tests and the shared suites, compute-sanitizer on every
# launch path (calls.py: call 7 of 2026-11-25's paths and the two-block ones), then stage 6
# re-recorded (lib.bench: the standard rows, sweep, README table and plots) if the tests pass.
set -u
D=$(dirname $0)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests 220 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py \
  tests/test_stages.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 60 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $D/calls.py
  tail -n 1 $OUT/logs/sanitize-$tool.log
done
step bench 240 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A8 "^| stage | shape | dtype | causal | µs" $OUT/logs/bench.log | head -12 | cut -c1-200
tar czf $OUT/run.tgz results README.md
tar czf $OUT/logs.tgz -C $OUT logs
