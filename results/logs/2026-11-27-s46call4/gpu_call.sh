#!/usr/bin/env bash
# GPU call 4 of session 46: stage 7's consumers taking turns at the exponential unit
# (scripts/fp8_exp_turns_ab.py: the whole softmax in the turn, or only the exponentials and P's
# casts), against the build as called and stage 6, at issue 25's two shapes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-27-s46call4
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee $L/gpu.txt
timeout 400 python3 scripts/fp8_exp_turns_ab.py --out $L/ab.json 2>&1 | tee $L/ab.log
echo "rc=$?"
tar czf $OUT/run.tgz $L
