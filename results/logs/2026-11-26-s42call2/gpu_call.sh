#!/usr/bin/env bash
# GPU call 2 of session 42: stage 6 re-recorded after changes that leave its kernels' SASS as it was
# (the work queue's order from stages/work_queue.cuh, the PDL wrappers from stages/pdl.cuh, and the
# plan's combine rule as one function, combine_in_last_block): its standard rows (lib.bench, fp16 and
# bf16), the training record (its hashes include stage 6's) and the shape map (bf16). Stage 6's
# tests on the H100 run in call 3 (call 1 ran its queue, split and decoding tests).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call2
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step bench 150 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A8 "^| stage | shape | dtype | causal | µs" $L/bench.log | head -10 | cut -c1-200; tail -1 $L/bench.log | cut -c1-250
step train 90 python3 scripts/train_curve.py --record; tail -2 $L/train.log | cut -c1-200
left=$(( 585 - ($(date +%s) - T0) ))
echo "shape map: $left s left"
step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $L/shape_map.log | cut -c1-200
tar czf $OUT/run.tgz results README.md $L
