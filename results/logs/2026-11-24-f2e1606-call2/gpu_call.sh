#!/usr/bin/env bash
# GPU call 2 of session 27 (2026-11-24) at commit f2e1606: stages 0, 1 and 2 re-recorded (fp16 and
# bf16, standard shapes and the sweep), their sources having changed for issue 22 (stage 0 and 1:
# SDPA's causal-bias objects and a clear refusal of bottom-right; stage 2: the causal diagonal).
# Stages 3-6 follow in call 3. Wheels: bash ../shared/h100/fetch-wheels.sh .whl transformers;
# rm .whl/debugpy-* .whl/hf_xet-*
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=f2e1606
timeout 560 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 0 1 2 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -A12 "^| stage | shape | dtype | causal | µs" $OUT/bench.log | head -14
tar czf $OUT/run.tgz results README.md
