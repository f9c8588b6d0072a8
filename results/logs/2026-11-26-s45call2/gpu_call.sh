#!/usr/bin/env bash
# GPU call 2 of session 45: stages 2, 3 and 4 re-recorded with lib.timing's settled, rotating rounds
# (session 44), so that the README table's median SDPA time per shape, taken over every stage's
# rows, is no longer a mix of the two timing methods (stage 6's rows were re-recorded so in
# session 44; stages 0-5 still held SDPA times from the fixed order, 9-13% faster at the long shape).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s45call2
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
OUT=$L bash scripts/record_stages.sh 560 2 3 4
for s in 2 3 4; do grep -A12 "^| stage | shape | dtype | causal | µs" $L/bench-stage$s.log | head -14 | cut -c1-200; done
tar czf $OUT/run.tgz results/*.json results/*.png README.md $L
