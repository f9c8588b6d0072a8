#!/usr/bin/env bash
# calls.py as this call ran it: call 3's copy (results/logs/2026-11-26-s34call3/calls.py), with
# only its docstring saying which calls ran it; the separate copy is dropped.
cd "$(dirname "$0")" && cp ../2026-11-26-s34call3/calls.py calls.py
