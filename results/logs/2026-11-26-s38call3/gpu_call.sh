#!/usr/bin/env bash
# GPU call 3 of session 38 (issue 25): compute-sanitizer again on the wide tiles' launch paths,
# with the emulation's running max at the kernel's key tiles (call 2's synccheck run found 0
# errors but failed that check with call 1's 128-key emulation), then stage 7's other switches
# against the default in the same rounds (options_ab.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
here=results/logs/2026-11-26-s38call3
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 90 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 $here/wide_tiles_calls.py
  grep -h "calls done" $OUT/logs/sanitize-$tool.log; tail -1 $OUT/logs/sanitize-$tool.log
done
step options 300 python3 $here/options_ab.py; grep -E "^B|Error" $OUT/logs/options.log
