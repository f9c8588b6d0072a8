#!/usr/bin/env bash
# GPU call 9 of session 40 (issue 21): the work queue handing only its last waves of causal work
# tiles out longest first (tail_waves; TAIL_WAVES off until measured). The A/B against the plain
# order (tail_ab.py), stage 6's tests (the producer's slot mapping is new in every build),
# compute-sanitizer on every launch path (session 36's calls.py, plain and with a tail of two waves). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call9
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tail 300 python3 $here/tail_ab.py; grep -E "^B|Error" $L/tail.log | cut -c1-230
step tests 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
step sanitize-memcheck-default 120 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=attention \
  --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
echo "  $(grep -h 'calls done' $L/sanitize-memcheck-default.log) / $(tail -n 1 $L/sanitize-memcheck-default.log)"
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 120 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $here/calls_tail.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -n 1 $L/sanitize-$tool.log)"
done
tar czf $OUT/run.tgz $L
