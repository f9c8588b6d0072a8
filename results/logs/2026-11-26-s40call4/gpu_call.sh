#!/usr/bin/env bash
# GPU call 4 of session 40 (issue 21): stage 6 with the stmatrix epilogue alone (call 3: the
# in-branch zeroing of O cost D64 causal 1-2%; undone). Stage 6's tests, compute-sanitizer on
# every launch path, and the stmatrix stores against the sources before them (stsm_ab.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call4
L=$here/device; mkdir -p $L /tmp/before
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
git apply -R $here/stage6_stsm.patch && cp stages/stage6.cu /tmp/before/stage6_before.cu && git apply $here/stage6_stsm.patch
cp stages/stage6.py /tmp/before/stage6_before.py
git diff --no-index --stat /tmp/before/stage6_before.cu stages/stage6.cu | tail -1
step stsm 300 python3 $here/stsm_ab.py; grep -E "^B|Error" $L/stsm.log | cut -c1-200
step tests 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 120 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
  tail -n 1 $L/sanitize-$tool.log
done
tar czf $OUT/run.tgz $L
