#!/usr/bin/env bash
# GPU call 5 of session 41 (issue 25): stage 7's HALF_MAX (stage7_half_max.patch, applied here
# only): each key tile's first half of columns exponentiated against its own row max while the
# second half's is reduced. The A/B against the build without (half_max_ab.py), then stage 7's
# tests with HALF_MAX on at both head dims (the emulation rule at every shape they check). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
git apply $here/stage7_half_max.patch && echo "patch applied"
step half_max 240 python3 $here/half_max_ab.py; grep -E "^B|Error" $L/half_max.log | cut -c1-260
cat > /tmp/half_on.py <<'PY'
import sys, pytest
import stages.stage7 as s7
s7.HALF_MAX.update({64: True, 128: True})
sys.exit(pytest.main(sys.argv[1:]))
PY
step tests-half-max 240 python3 /tmp/half_on.py -q -rf -p no:cacheprovider tests/test_stage7.py
grep -E "passed|failed|^FAILED" $L/tests-half-max.log | cut -c1-240 | head -8
git apply -R $here/stage7_half_max.patch
tar czf $OUT/run.tgz $L
