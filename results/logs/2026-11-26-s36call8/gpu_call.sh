#!/usr/bin/env bash
# GPU call 8 of session 36 (issue 21): split-KV's combine in the last block reads a whole work
# tile's partial rows in one L2 round trip per eight splits (combine_part) instead of one warp per
# row, row after row. Stage 6's tests, compute-sanitizer on every launch path (call 4's calls.py),
# the new kernel against the one before (b30d19a, stage6-b30d19a.cu) at the split decoding rows in the same
# rounds (scripts/stage6_ab.py --decode); then, if the tests pass and the new kernel is not
# slower (median of the rows' ratios >= 1), stage 6 and its shape map re-recorded.
set -u
D=$(dirname $0)
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests 180 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py -k "not shape_map_rows"; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 60 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 results/logs/2026-11-26-s36call4/calls.py
  tail -n 1 $OUT/logs/sanitize-$tool.log
done
[ -e $D/stage6-b30d19a.cu ] || bash $D/sources.sh  # (run where git is, before the call)
OLD=$(ls $D/stage6-*.cu); REV=$(basename $OLD .cu); REV=${REV#stage6-}
step ab 150 python3 scripts/stage6_ab.py --decode --against $REV --older-file $OLD
grep -E "^\||today /" $OUT/logs/ab.log | cut -c1-200
gain=$(python3 - $OUT/logs/ab.log <<'PY'
import re, statistics, sys
r = [float(m.group(1)) for m in re.finditer(r"^\|[^|]+\|[^|]+\|[^|]+\|[^|]+\| ([0-9.]+) \|", open(sys.argv[1]).read(), re.M)]
print("yes" if r and statistics.median(r) >= 1.0 else "no")
PY
)
echo "record: tests rc=$tests_rc, not slower: $gain"
if [ $tests_rc -eq 0 ] && [ "$gain" = yes ]; then
  step bench 150 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
  grep -A8 "^| stage | shape | dtype | causal | µs" $OUT/logs/bench.log | head -10 | cut -c1-200
  left=$(( 580 - ($(date +%s) - T0) ))
  echo "shape map: $left s left"
  [ $left -gt 60 ] && step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
  tail -n 4 $OUT/logs/shape_map.log | cut -c1-200
fi
tar czf $OUT/run.tgz results README.md
tar czf $OUT/logs.tgz -C $OUT logs
