#!/usr/bin/env bash
# GPU call 4 of session 38 (issue 25): Nsight Compute on stage 7 at B16 H16 S2048 D64 (547
# TFLOPS against a count of ~830: the notebook's open question) and at B4 H16 S8192 D128 with
# the new 192-key tiles (beside session 37's profile of the 128-key build), then call 3's
# schedules once more (schedules_ab.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
here=results/logs/2026-11-26-s38call4
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for shape in "16 16 16 2048 2048 64:fp8d64" "4 16 16 8192 8192 128:fp8d128"; do
  args=${shape%%:*}; name=${shape##*:}
  step ncu-$name 200 ncu --profile-from-start off --clock-control none --set full --import-source no -o $OUT/logs/$name python3 scripts/profile_pair.py $args --stage 7 --no-sdpa
  ncu -i $OUT/logs/$name.ncu-rep --page details --print-details all > $OUT/logs/$name-details.txt 2>&1
  ncu -i $OUT/logs/$name.ncu-rep --page source --print-source sass --csv > $OUT/logs/$name-sass.csv 2>&1; gzip -f $OUT/logs/$name-sass.csv
  echo "== $name"; grep -E "^    (Duration|SM Frequency)|Issue Slots Busy|Pipe Tensor Cycles Active|Inst Executed Pipe Xu|Pipe Fma Cycles Active|Pipe Alu Cycles|No Eligible|Registers Per Thread" $OUT/logs/$name-details.txt | sort -u | cut -c1-140 | head -20
  gzip -f $OUT/logs/$name-details.txt
done
rm -f $OUT/logs/*.ncu-rep
step schedules 300 python3 $here/schedules_ab.py; grep -E "^B|Error" $OUT/logs/schedules.log
