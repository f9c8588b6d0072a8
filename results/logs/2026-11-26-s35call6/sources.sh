# Call 6 ran the calls.py now in results/logs/2026-11-26-s35call9 (unchanged; it also runs the preprocess kernel there).
