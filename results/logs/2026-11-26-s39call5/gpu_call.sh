#!/usr/bin/env bash
# GPU call 5 of session 39 (issue 21): stage 6's split kernel launched with PDL too (PDL_KERNEL,
# griddep_wait after its barriers). Stage 6's tests (CUDA graphs and two streams included),
# compute-sanitizer over every launch path, then PDL on both kernels against the combine only
# and none (pdl_kernel_ab.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s39call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tests 200 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py tests/test_backward.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 90 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
  tail -n 1 $L/sanitize-$tool.log
done
step pdl 240 python3 $here/pdl_kernel_ab.py; grep -E "^B|^PDL|Error" $L/pdl.log
tar czf $OUT/run.tgz $L
