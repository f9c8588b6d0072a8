#!/usr/bin/env bash
# GPU call 1 of session 38 (issue 25): stage 7 with key tiles wider than 128 (FlashAttention-3's
# FP8 tiles: 160 keys at D64, 224 at D128). Stage 7's tests (the new test_wider_key_tiles among
# them), compute-sanitizer on the wide tiles' launch paths, then scripts/fp8_tiles.py: every
# candidate against the default tiles and stage 6 in the same interleaved rounds.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
here=results/logs/2026-11-26-s38call1
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step pytest 200 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 90 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 $here/wide_tiles_calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step tiles 300 python3 scripts/fp8_tiles.py --out $OUT/logs/fp8_tiles.json
grep -E "^\||FAIL" $OUT/logs/tiles.log | cut -c1-200
