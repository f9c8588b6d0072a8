#!/usr/bin/env bash
# The two older builds this call's A/B read, rebuilt from git (the GPU machine gets the working
# tree without .git): the kernel before 63e58db's change, and 63e58db's kernel with only its
# shared-memory alignment put back (stage7-generic-smem.patch). Both were committed verbatim at
# first; git and the patch hold the same bytes.
cd "$(dirname "$0")" && git show d021463:stages/stage7.cu > stage7-d021463.cu \
  && git show 63e58db:stages/stage7.cu > stage7-generic-smem.cu && patch -s stage7-generic-smem.cu stage7-generic-smem.patch
