#!/usr/bin/env bash
# GPU call 10 of session 30 (2026-11-25) at commit 58dca8a: stage 8 with its WGMMA build's overlap — tests,
# the backward record (every build, five interleaved rounds), the training record again (stage 8's
# sources changed), then the stage 8 notebook and the journey executed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=58dca8a
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py > $OUT/pytest-backward.log 2>&1; rc=$?; echo "pytest backward rc=$rc"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-backward.log | head -10 | cut -c1-300
[ $rc -eq 0 ] || exit 1
timeout 280 python3 scripts/backward_bench.py --record --variants --rounds 5 > $OUT/backward.log 2>&1; echo "backward bench rc=$?"
grep -E "WGMMA without|^\| B" $OUT/backward.log | cut -c1-200
timeout 200 python3 scripts/train_curve.py --record > $OUT/train.log 2>&1; echo "train rc=$?"
grep -E "first step|after|seed|mixed|forward" $OUT/train.log | cut -c1-200
for nb in stage8_backward journey; do
  t0=$(date +%s); timeout 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$? $(( $(date +%s) - t0 )) s"
done
tar czf $OUT/run.tgz results notebooks/stage8_backward.ipynb notebooks/journey.ipynb
