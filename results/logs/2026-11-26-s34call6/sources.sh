#!/usr/bin/env bash
# calls.py as this call ran it: session 31's launch paths (results/logs/2026-11-25-ab914da-call7/calls.py), with
# only its docstring saying which calls ran it; the separate copy is dropped.
cd "$(dirname "$0")" && cp ../2026-11-25-ab914da-call7/calls.py calls.py
