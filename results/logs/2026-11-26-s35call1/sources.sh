# Call 1 (and call 2) ran results/logs/2026-11-26-s35call1/calls.py at 15b7a96; call 3's calls.py is
# the same with the bulk-reduction switch added. To get call 1's file back:
git show 15b7a96:results/logs/2026-11-26-s35call1/calls.py > results/logs/2026-11-26-s35call1/calls.py
