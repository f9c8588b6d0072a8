#!/usr/bin/env bash
# GPU call 9 of session 35 (call 8 was written and never run): stage 8's preprocess as one
# kernel (δ and lse·log2 e; six PyTorch kernels before) and dQ's postprocess as one copy. Tests,
# compute-sanitizer on every build (each runs the preprocess), the backward and training records
# again, and the stage 8 and journey notebooks executed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
L=results/logs/2026-11-26-s35call9
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 8"
step pytest 120 python3 -m pytest -q -x $XD tests/test_backward.py tests/test_hf.py; tail -1 $OUT/logs/pytest.log
for tool in racecheck memcheck synccheck; do
  step sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step backward 200 python3 scripts/backward_bench.py --record --variants --rounds 5
grep -E "^\| B|recorded|not recorded" $OUT/logs/backward.log | cut -c1-200
step train 60 python3 scripts/train_curve.py --record; tail -2 $OUT/logs/train.log
for nb in stage8_backward journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage8_backward.ipynb notebooks/journey.ipynb
