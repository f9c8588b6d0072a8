"""Session 36's calls.py (every launch path of stage 6, each output checked) with causal work
handed out in head groups (stage6.HEAD_GROUPS on), for compute-sanitizer."""
import runpy

import stages.stage6 as s6

s6.HEAD_GROUPS = True
runpy.run_path("results/logs/2026-11-26-s36call4/calls.py", run_name="__main__")
