#!/usr/bin/env bash
# GPU call 3 of session 37 (issue 23): stage 8's preprocess with 16-byte loads (D/8 threads per
# row), timed against the one before in the same rounds; the D 64 build without OVERLAP (measured
# 1.00-1.015x in three records). Stage 8's tests, compute-sanitizer, then the backward record
# (bf16 and fp16, every variant in bf16), the training record, the stage 8 and journey notebooks.
set -u
L=results/logs/2026-11-26-s37call3
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_backward.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 results/logs/2026-11-26-s37call1/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step preprocess-ab 60 python3 $L/preprocess_ab.py; pre_rc=$?; cat $OUT/logs/preprocess-ab.log | tail -3
if [ $tests_rc -eq 0 ] && [ $pre_rc -eq 0 ]; then
  step backward 260 python3 scripts/backward_bench.py --record --variants --rounds 5
  grep -E "^\| B|recorded|not recorded|overlap|3 blocks" $OUT/logs/backward.log | cut -c1-220
  step train 60 python3 scripts/train_curve.py --record; tail -1 $OUT/logs/train.log
  for nb in stage8_backward journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
fi
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage8_backward.ipynb notebooks/journey.ipynb
rm -f $OUT/logs/nb-*.log
