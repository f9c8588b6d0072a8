# Calls 10 and 11 ran the calls.py now in results/logs/2026-11-26-s35call12 (unchanged; call 12 runs the postprocess kernel through it too).
