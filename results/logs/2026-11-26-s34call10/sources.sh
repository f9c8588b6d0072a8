#!/usr/bin/env bash
# calls.py as this call ran it: session 31's launch paths (results/logs/2026-11-25-ab914da-call7/calls.py), with
# only its docstring and one comment (the D64 row now runs a 4-deep ring) different; the copy is dropped.
cd "$(dirname "$0")" && cp ../2026-11-25-ab914da-call7/calls.py calls.py
