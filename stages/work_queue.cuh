// The work queue's hand-out order, shared by stages 6 and 7 (their producers' DYNAMIC_WORK
// loops). A persistent block asks a counter for its next slot; this maps slot to work tile.
// Work tiles are numbered (batch, head) pair after pair, n_qb query blocks each, each pair's
// heaviest query block first. In order, the queue would end on heavy causal tiles, and the
// block that takes one would finish last while the others idle. So the last `tail_heads` pairs
// (stages/stage6.py: tail_heads_for says how many, and why) are handed out longest first
// across them: every one's first (heaviest) query block, then every one's second, ... Slots
// before them, slots past the end, and launches without the queue (dynamic false) or without a
// tail (tail_heads <= 0) keep their order. Only the producer's thread maps slots to tiles: the
// consumers read the tile's index from its Q slot.
#pragma once

__device__ __forceinline__ int handed_out(int slot, int n_work, int n_qb, int tail_heads, bool dynamic) {
    const int first = n_work / n_qb - tail_heads;  // the first pair of the tail
    if (!dynamic || tail_heads <= 0 || slot < first * n_qb || slot >= n_work) return slot;
    const int r = slot - first * n_qb, qb_in = r / tail_heads;
    return (first + r - qb_in * tail_heads) * n_qb + qb_in;
}
