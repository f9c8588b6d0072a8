# Call 9 ran the calls.py at dc38ec4: git show dc38ec4:results/logs/2026-11-26-s35call9/calls.py (call 10's adds DQ_TURNS at D 64)
