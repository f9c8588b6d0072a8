#!/usr/bin/env bash
# GPU call 9 of session 30 (2026-11-25) at commit 315699b: the training record again, with five seeds of the
# three runs and the two mixed runs (stage 5's forward with SDPA's backward and the other way),
# then the stage 8 notebook and the journey executed, and the tests of stage 8 and lib.hf.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=315699b
timeout 300 python3 scripts/train_curve.py --record > $OUT/train.log 2>&1; echo "train rc=$?"
grep -vE "Warning|warn|step " $OUT/train.log | tail -16 | cut -c1-220
for nb in stage8_backward journey; do
  t0=$(date +%s); timeout 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$? $(( $(date +%s) - t0 )) s"
done
tar czf $OUT/run.tgz results notebooks/stage8_backward.ipynb notebooks/journey.ipynb
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py tests/test_hf.py > $OUT/pytest-backward.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-backward.log | head -10 | cut -c1-300
