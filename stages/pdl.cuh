// Programmatic dependent launch (PDL, sm_90+), stages 6 and 7: a kernel launched with the PDL
// attribute (lib.nvrtc.launch_config(pdl=True)) may start before the kernel before it in the
// stream has finished; it calls griddep_wait before it reads what that kernel wrote (the wait
// returns once that grid has finished and its writes are visible; at once in a grid launched
// without PDL). A kernel lets its PDL successor start early with griddep_launch_dependents: the
// successor is launched once every block has called it or ended (a no-op without one); its
// blocks then take SM resources (shared memory, threads) while they wait, so a kernel whose
// successor is heavy lets go at the end of its blocks' work, not at their start. Stage 6 uses
// them for its split-KV combine, stage 7 after its quantizing casts.
#pragma once

__device__ __forceinline__ void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
