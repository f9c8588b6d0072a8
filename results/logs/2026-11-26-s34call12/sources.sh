#!/usr/bin/env bash
# The older kernel this call's A/B read (stage7-d021463.cu), rebuilt from git (the GPU machine gets
# the working tree without .git); it was committed verbatim at first, and git holds the same bytes.
cd "$(dirname "$0")" && git show d021463:stages/stage7.cu > stage7-d021463.cu
