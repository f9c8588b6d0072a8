# Call 4 ran the calls.py now in results/logs/2026-11-26-s35call5 (unchanged since).
