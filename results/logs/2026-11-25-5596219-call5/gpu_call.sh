#!/usr/bin/env bash
# GPU call 5 of session 30 (2026-11-25) at commit 5596219: the notebooks that read stage 4's and stage 5's
# new records executed (stage 4, stage 5, stage 6 and the introduction; the journey and stage 8
# come with stage 8's record in a later call), and the whole GPU suite.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=5596219
for nb in stage4_large_tiles stage6_wgmma_tma 00_introduction stage5_vectorized; do
  t0=$(date +%s); timeout 260 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$? $(( $(date +%s) - t0 )) s"
done
tar czf $OUT/run.tgz notebooks/stage4_large_tiles.ipynb notebooks/stage6_wgmma_tma.ipynb notebooks/00_introduction.ipynb notebooks/stage5_vectorized.ipynb
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests --ignore=tests/test_notebook_consistency.py > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|FAILED" $OUT/pytest.log | head -20 | cut -c1-250
