#!/usr/bin/env bash
# GPU call 12 of session 39 (issue 25): the whole stage 7 call at D128 S8192 with the attention
# kernel launched with PDL too (forced: the rule leaves a persistent launch without it), and
# without, in both orders within the rounds (kernel_pdl_ab.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0
here=results/logs/2026-11-26-s39call12
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 200 python3 $here/kernel_pdl_ab.py > $L/order.log 2>&1; echo "order rc=$?"; cat $L/order.log | grep -E "^B|Error"
tar czf $OUT/run.tgz $L
