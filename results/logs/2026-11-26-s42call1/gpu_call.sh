#!/usr/bin/env bash
# GPU call 1 of session 42: (1) the work queue's hand-out order moved to stages/work_queue.cuh and
# stage 6's PDL wrappers to stages/pdl.cuh (SASS identical for 12 builds, checked offline), and the
# new l2_promotion option: stage 6's queue, decoding and option tests on the H100; (2) issue 21:
# scripts/l2_promotion_ab.py, the tensor maps' L2 promotion 0 / 128 / 256 bytes at the recorded
# map's rows (decoding Sq 1 and Sq 4, prefill), same rounds.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call1
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import cuda.core, inspect; from cuda.core.utils import StridedMemoryView as V; print('cuda.core', cuda.core.__version__, 'l2_promotion' in str(inspect.signature(V.as_tensor_map)))"
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py -k "l2_promotion or tail or queue or few_keys or split or pack"
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
left=$(( 570 - ($(date +%s) - T0) ))
echo "A/B: $left s left"
step l2ab $left python3 scripts/l2_promotion_ab.py --out $L/l2_promotion.json
grep -E "^\[" $L/l2ab.log | cut -c1-330
tail -1 $L/l2ab.log
tar czf $OUT/run.tgz $L
