#!/usr/bin/env bash
# GPU call 1 of session 41 (issue 21): the decoding rows still under SDPA. The producer's L2
# prefetch of the key tiles past the ring (l2_ahead, L2_AHEAD off until measured) and persistent
# blocks two per SM, against the launch as called at the map's Sq 1 rows
# (scripts/decode_launch_ab.py --launch prefetch); stage 6's tests; compute-sanitizer on the new
# launch paths (calls_new.py) and on every old one with the new source (session 36's calls.py). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call1
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step prefetch 330 python3 scripts/decode_launch_ab.py --launch prefetch --out $L/prefetch.json
grep -E "^\[|every|failed" $L/prefetch.log | cut -c1-330
step tests 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py -k "not shape_map_rows"
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $here/calls_new.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -n 1 $L/sanitize-$tool.log)"
done
step sanitize-memcheck-old 150 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=attention \
  --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
echo "  $(grep -h 'calls done' $L/sanitize-memcheck-old.log) / $(tail -n 1 $L/sanitize-memcheck-old.log)"
tar czf $OUT/run.tgz $L
