#!/usr/bin/env bash
# GPU call 8 of session 30 (2026-11-25) at commit a12d505: the training run recorded again with SDPA's FLASH
# backend as a third curve and the gradients checked at the trained weights too; stage 8's tests;
# the stage 8 notebook and the journey executed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=a12d505
timeout 200 python3 scripts/train_curve.py --record > $OUT/train.log 2>&1; echo "train rc=$?"
grep -vE "Warning|warn" $OUT/train.log | tail -18 | cut -c1-200
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward.py tests/test_hf.py > $OUT/pytest-backward.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|FAILED|^E " $OUT/pytest-backward.log | head -20 | cut -c1-300
for nb in stage8_backward journey; do
  t0=$(date +%s); timeout 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$? $(( $(date +%s) - t0 )) s"
done
tar czf $OUT/run.tgz results notebooks/stage8_backward.ipynb notebooks/journey.ipynb
