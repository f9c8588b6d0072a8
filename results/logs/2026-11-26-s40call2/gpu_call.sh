#!/usr/bin/env bash
# GPU call 2 of session 40 (issue 21): stage 6's epilogue with stmatrix and O zeroed only where a
# work tile's rows see no key. Stage 6's tests; compute-sanitizer on every launch path (session
# 36's calls.py: the TMA-store epilogue at D64 and D128, two and three Q buffers, the carried
# P·V); the new epilogue against the sources before it, same rounds (epilogue_ab.py). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call2
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
# the sources before the change, as a module of their own
mkdir -p /tmp/before
git apply -R $here/stage6_epilogue.patch && cp stages/stage6.cu /tmp/before/stage6_before.cu && git apply $here/stage6_epilogue.patch
sed 's/^SOURCE = .*/SOURCE = Path(__file__).with_suffix(".cu")/' stages/stage6.py > /tmp/before/stage6_before.py
git diff --no-index --stat /tmp/before/stage6_before.cu stages/stage6.cu | tail -1
step tests 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 120 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
  tail -n 1 $L/sanitize-$tool.log
done
step epilogue 300 python3 $here/epilogue_ab.py; grep -E "^B|Error" $L/epilogue.log | cut -c1-220
tar czf $OUT/run.tgz $L
