# Call 5 ran the calls.py at 08eeb6d: git show 08eeb6d:results/logs/2026-11-26-s35call5/calls.py (call 6's adds the stage's builds)
