#!/usr/bin/env bash
# (Before running it again: bash $(dirname $0)/sources.sh, where git is, makes the files it reads.)
# GPU call 12 of session 34: stage 7 with stage 6's cheaper work-tile start and end: its tests,
# the same kernel before the change in the same rounds (stage7_ab.py), its benchmark re-recorded
# (scripts/fp8_bench.py --record: its sources changed); then the notebooks that show stage 6's and
# stage 7's records executed against them (stage 6 re-recorded in call 11 at f098bb7).
set -u
D=$(dirname $0)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests7 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/tests7.log | cut -c1-240 | head -10
step ab7 150 python3 $D/stage7_ab.py
cat $OUT/logs/ab7.log | cut -c1-300
if [ $tests_rc -eq 0 ]; then
  step fp8bench 150 python3 scripts/fp8_bench.py --record --out $OUT/logs/fp8_bench.json
  grep -E "^\||ceilings|recorded|FAIL" $OUT/logs/fp8bench.log | cut -c1-260
fi
for nb in stage6_wgmma_tma journey 00_introduction stage7_fp8 stage8_backward; do
  step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log | cut -c1-200
done
tar czf $OUT/run.tgz notebooks results README.md
tar czf $OUT/logs.tgz -C $OUT logs
