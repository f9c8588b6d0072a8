"""Session 36's calls.py (every launch path of stage 6, each output checked) with causal work
on the queue handed out in head groups filling 1/16 of the L2 (stage6.HEAD_GROUP_SHARE), for
compute-sanitizer."""
import runpy

import stages.stage6 as s6

s6.HEAD_GROUP_SHARE = 16
runpy.run_path("results/logs/2026-11-26-s36call4/calls.py", run_name="__main__")
