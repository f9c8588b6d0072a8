#!/usr/bin/env bash
# GPU call 3 of session 41 (issue 21): decoding blocks of one or two key tiles at D64 now run
# without a producer, three per SM (stage6.few_keys_per_block; call 2 measured it and ran the
# sanitizers on that kernel, whose source is unchanged since). Stage 6's tests and the other
# files that run it; memcheck on every old launch path with the new choice; then stage 6
# re-recorded: its standard rows (lib.bench, fp16 and bf16) and the shape map (bf16).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call3
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tests 170 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
step sanitize-memcheck-old 90 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=attention \
  --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
echo "  $(grep -h 'calls done' $L/sanitize-memcheck-old.log) / $(tail -n 1 $L/sanitize-memcheck-old.log)"
step bench 150 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A8 "^| stage | shape | dtype | causal | µs" $L/bench.log | head -10 | cut -c1-200; tail -1 $L/bench.log | cut -c1-250
left=$(( 585 - ($(date +%s) - T0) ))
echo "shape map: $left s left"
step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $L/shape_map.log | cut -c1-200
tar czf $OUT/run.tgz results README.md $L
