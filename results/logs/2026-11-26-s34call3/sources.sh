#!/usr/bin/env bash
# The files this call read, rebuilt where git is (the GPU machine gets the working tree without
# .git); both were committed verbatim at first and are dropped because git holds the same bytes:
# the older kernel of its A/B ($D/stage6-d1832bb.cu), and calls.py, session 31's launch paths
# (results/logs/2026-11-25-ab914da-call7/calls.py; this call's copy differed only in a docstring
# saying where it came from).
cd "$(dirname "$0")" && git show d1832bb:stages/stage6.cu > stage6-d1832bb.cu && cp ../2026-11-25-ab914da-call7/calls.py calls.py
