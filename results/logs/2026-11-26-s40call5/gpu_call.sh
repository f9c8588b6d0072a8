#!/usr/bin/env bash
# GPU call 5 of session 40 (issue 21): EARLY_S, each work tile's epilogue under the next one's
# first S (off by default, measured here). Stage 6's tests (the new bit-equality test among
# them), compute-sanitizer on its launch paths (early_calls.py; the default builds' SASS is
# unchanged), and EARLY_S against the launch as called (early_ab.py). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step early 300 python3 $here/early_ab.py; grep -E "^B|Error" $L/early.log | cut -c1-230
step tests 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $here/early_calls.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -n 1 $L/sanitize-$tool.log)"
done
tar czf $OUT/run.tgz $L
