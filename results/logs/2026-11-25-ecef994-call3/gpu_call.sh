#!/usr/bin/env bash
# GPU call 3 of session 30 (2026-11-25) at commit ecef994: Nsight Compute on stage 4's new default build
# at the throughput shape (the same command as the report it replaces: its first line), and
# stage 5's idea-by-idea record at today's sources (stage 5 gained the log-sum-exp output).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=ecef994
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
args=$(head -1 results/profiles/stage4-throughput.ncu.txt | sed 's/^# ncu //; s/; commit.*//')
python3 -c "import stages.stage4" && timeout 200 $NCU $args > $OUT/profile4.log 2>&1; rc=$?; echo "profile stage 4 rc=$rc"
if [ $rc -eq 0 ]; then
  { echo "# ncu $args; commit ecef994, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"; cat $OUT/profile4.log; } > results/profiles/stage4-throughput.ncu.txt
fi
grep -E "Duration|Achieved Occupancy|inst_executed.sum|op_branch.sum|bank_conflicts" $OUT/profile4.log | head -12
timeout 330 python3 scripts/stage5_ideas.py --record > $OUT/stage5_ideas.log 2>&1; echo "stage5 ideas rc=$?"
tail -25 $OUT/stage5_ideas.log | cut -c1-200
tar czf $OUT/run.tgz results
