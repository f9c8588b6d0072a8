#!/usr/bin/env bash
# GPU call 1 of session 40. Issue 25: stage 7's tests with PACK_IN_SOFTMAX (the previous P·V
# waited for between a tile's row maxima and its exponentials, so P's e4m3 casts run among the
# MUFU.EX2), and its A/B against the build without (pack7_ab.py). Issue 21: Nsight Compute on
# stage 6 and cuDNN at D64 causal S512 (SASS with execution counts: where the per-work-tile
# instructions go now), then the same switch for stage 6 as a patch (stage6_pack.patch, applied
# here only) and its A/B at the map's lowest prefill rows (pack6_ab.py). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call1
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step pytest 300 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
step pack7 200 python3 $here/pack7_ab.py; grep -E "^B|Error" $L/pack7.log | cut -c1-260
name=causal512
step ncu-$name 200 ncu --profile-from-start off --clock-control none --set full --import-source no -o $L/$name python3 scripts/profile_pair.py 32 16 16 512 512 64 --causal
ncu -i $L/$name.ncu-rep --page details --print-details all > $L/$name-details.txt 2>&1
ncu -i $L/$name.ncu-rep --page source --print-source sass --csv > $L/$name-sass.csv 2>&1; gzip -f $L/$name-sass.csv
grep -E "^  [a-z]|^    (Duration|SM Frequency)|Issue Slots Busy|Pipe Tensor Cycles Active|Inst Executed Pipe Xu|No Eligible|Registers Per Thread|Eligible Warps" $L/$name-details.txt | sort -u | cut -c1-140 | head -24
gzip -f $L/$name-details.txt; rm -f $L/*.ncu-rep
git apply $here/stage6_pack.patch && echo "stage 6 patched"
step pack6 300 python3 $here/pack6_ab.py; grep -E "^B|Error" $L/pack6.log | cut -c1-260
tar czf $OUT/run.tgz $L
