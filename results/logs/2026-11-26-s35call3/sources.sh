# Call 3 ran results/logs/2026-11-26-s35call3/calls.py at d220106 (call 4's, without the TMA switch):
git show d220106:results/logs/2026-11-26-s35call3/calls.py > results/logs/2026-11-26-s35call3/calls.py
