"""Session 36's calls.py (every launch path of stage 6, each output checked) with the work queue's
last two waves of causal work tiles handed out longest first (stage6.TAIL_WAVES = 2), for
compute-sanitizer."""
import runpy

import stages.stage6 as s6

s6.TAIL_WAVES = 2
runpy.run_path("results/logs/2026-11-26-s36call4/calls.py", run_name="__main__")
