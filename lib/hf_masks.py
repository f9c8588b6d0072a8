"""What a transformers attention mask says, as the stages take it (lib.hf's adapter reads it):
padding (a range of query rows and of keys per batch entry) plus full attention or causal
attention aligned to the bottom right (a cache offset), with or without a sliding window; and
the unpad/pad indices of packed sequences for it. Needs torch only."""
from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch


@dataclass
class MaskLayout:
    """What a transformers attention mask [B, 1 or H, Sq, Sk] says, as the stages take it:
    batch entry b's real queries are rows q_start[b] … q_end[b] − 1 and they see keys
    k_start[b] … k_end[b] − 1 — all of them (causal False), or bottom-right causal within
    those ranges (query row q_end − 1 sees key k_end − 1; one row back, one key fewer), and
    with a `window` of left keys (causal only) no key more than `window` before the row's
    diagonal (transformers' sliding window of W keys: W − 1; stage 6's window=(window, 0)).
    Rows outside a q range (padding) see no key."""

    causal: bool
    q_start: list[int]
    q_end: list[int]
    k_start: list[int]
    k_end: list[int]
    Sq: int
    Sk: int
    window: int | None = None

    @property
    def unpadded(self) -> bool:
        """Every entry has all its rows and starts its keys at 0 (only the key ends may differ)."""
        return (all(s == 0 for s in self.q_start + self.k_start)
                and all(e == self.Sq for e in self.q_end))

    def cu(self, starts, ends):
        return [0, *itertools.accumulate(e - s for s, e in zip(starts, ends))]

    def packing(self, device):
        """The unpad/pad indices and offsets of attention_varlen for this layout, made once
        (every layer of a forward pass gets the same mask): (q rows, k rows, cu_q, cu_k,
        max_q, max_k), the rows as (batch index, position) tensors."""
        if getattr(self, "_packing", None) is None:
            from lib.inputs import offsets_tensor  # made from host values: checked without a read-back
            self._packing = (_rows(self.q_start, self.q_end, device), _rows(self.k_start, self.k_end, device),
                             offsets_tensor(self.cu(self.q_start, self.q_end), device),
                             offsets_tensor(self.cu(self.k_start, self.k_end), device),
                             max((e - s for s, e in zip(self.q_start, self.q_end)), default=0),
                             max((e - s for s, e in zip(self.k_start, self.k_end)), default=0))
        return self._packing


# The last layouts read: (weakref to the mask, its version, Sq, Sk, window, layout). A few, as a
# model with sliding and full layers (Gemma 2, gpt-oss) alternates two masks layer by layer.
_last_layouts: list = []
KEPT_LAYOUTS = 4


def mask_layout(mask: torch.Tensor, Sq: int, Sk: int, window: int | None = None) -> MaskLayout:
    """Read a boolean or additive attention mask as padding (a key range per entry, and the
    query rows that see any key) plus either full attention or causal attention aligned to the
    bottom right within each entry (a cache offset), with a sliding window of `window` left keys
    when one is given (a layer's sliding_window W: W − 1), by building that mask from the ranges
    and comparing. Anything else (an arbitrary pattern) is refused. One copy to the host per
    mask: a model's layers get the same mask objects, and the layouts read for them are kept.
    The layout's window is set only where it cuts a key (else plain causal is the same mask); a
    mask whose every real row sees all its entry's keys reads as full attention (decoding one
    query against no more keys than the window); and where the window alone hides an entry's
    first keys, its keys start at 0 (decoding past the window: one call, no packing)."""
    # An inference tensor has no version counter: a model builds a new mask per forward anyway.
    version = -1 if mask.is_inference() else mask._version
    for ref, ver, *shape, layout in _last_layouts:
        if ref() is mask and ver == version and shape == [Sq, Sk, window]:
            return layout
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if visible.dim() != 4 or visible.shape[-2:] != (Sq, Sk):
        raise NotImplementedError(f"an attention mask of shape {tuple(mask.shape)}: the stages "
                                  f"read masks of shape [B, 1 or H, {Sq}, {Sk}]")
    heads_differ = visible.shape[1] > 1 and not bool((visible == visible[:, :1]).all())
    vis = visible[:, 0]  # [B, Sq, Sk]
    i = torch.arange(Sq, device=vis.device)[:, None]
    j = torch.arange(Sk, device=vis.device)
    seen_key = vis.any(1)                                                # [B, Sk]
    ks = torch.where(seen_key.any(1), seen_key.int().argmax(1), Sk)      # first key anyone sees
    ke = torch.where(seen_key.any(1), Sk - 1 - seen_key.flip(1).int().argmax(1), -1)  # last
    row_any = vis.any(2)                                                 # [B, Sq]
    row_last = torch.where(row_any, Sk - 1 - vis.flip(2).int().argmax(2), -1)
    first_row = row_any.int().argmax(1)                                  # first row seeing a key
    off = row_last.gather(1, first_row[:, None])[:, 0] - first_row       # its diagonal: j <= i + off
    in_range = (j >= ks[:, None, None]) & (j <= ke[:, None, None])
    causal_mask = in_range & (j <= i + off[:, None, None])
    if window is not None:
        causal_mask &= j >= i + off[:, None, None] - window
    full_mask = in_range & row_any[:, :, None]
    facts = torch.stack([ks, ke, off, (vis == causal_mask).all((1, 2)).long(),
                         (vis == full_mask).all((1, 2)).long()]).tolist()  # the one sync
    ks_, ke_, off_, is_causal, is_full = facts
    B = vis.shape[0]
    if heads_differ or not (all(is_causal) or all(is_full)):
        raise NotImplementedError(
            f"this attention mask (shape {tuple(mask.shape)}) is neither padding nor causal "
            "attention aligned to the cache (bottom-right)"
            f"{'' if window is None else f' with a sliding window of {window + 1} keys'}, per batch "
            "entry: an arbitrary pattern that the stages do not compute. Use "
            "attn_implementation='sdpa' (or 'eager') for it")
    layout = _causal_reading(ks_, ke_, off_, Sq, Sk, window) if all(is_causal) else None
    # Full attention also passes the causal test when every row's diagonal lies past the last key:
    # read it as full then (decoding's one query included), unless the causal reading has a
    # window that cuts keys (decoding past the window: the window alone hides the first keys, the
    # keys start at 0, one call).
    if all(is_full) and (layout is None or layout.window is None):
        q_start, q_end = [], []
        for b in range(B):
            if ke_[b] < 0:  # an entry that sees nothing
                q_start.append(0), q_end.append(0)
                continue
            rows = row_any[b].nonzero()[:, 0].tolist()
            if rows != list(range(rows[0], rows[-1] + 1)):
                raise NotImplementedError("this attention mask pads rows in the middle of a "
                                          "sequence: the stages take one range of rows per entry")
            q_start.append(rows[0]), q_end.append(rows[-1] + 1)
        layout = MaskLayout(False, q_start, q_end, [min(s, e + 1) for s, e in zip(ks_, ke_)],
                            [e + 1 for e in ke_], Sq, Sk)
    _last_layouts.insert(0, (weakref.ref(mask), version, Sq, Sk, window, layout))
    del _last_layouts[KEPT_LAYOUTS:]
    return layout


def _causal_reading(ks, ke, off, Sq: int, Sk: int, window: int | None) -> MaskLayout:
    """The causal layout of entries whose keys ks[b] … ke[b] are seen by rows along the diagonal
    j = i + off[b] (and `window` keys behind it): the real rows are those whose diagonal reaches
    the first and the last key. The window is kept where it cuts a key; where it alone hides the
    keys before ks (the entry's rows are those of keys from 0 on), the keys start at 0."""
    q_start, q_end, k_start, cuts = [], [], [], False
    for b in range(len(ks)):
        if ke[b] < 0:  # an entry that sees nothing
            q_start.append(0), q_end.append(0), k_start.append(0)
            continue
        qs, qe, k0 = max(0, ks[b] - off[b]), min(Sq, ke[b] - off[b] + 1), ks[b]
        if window is not None:
            if qs == max(0, -off[b]) and qs + off[b] - window >= k0:
                k0 = 0
            cuts |= qe - 1 + off[b] - window > k0  # the last row's window starts latest
        q_start.append(qs), q_end.append(qe), k_start.append(k0)
    return MaskLayout(True, q_start, q_end, k_start, [e + 1 for e in ke], Sq, Sk,
                      window if cuts else None)


def _rows(starts, ends, device):
    """(batch index, row index) of every row start[b] … end[b] − 1, in order, for gathering."""
    b = [bb for bb, (s, e) in enumerate(zip(starts, ends)) for _ in range(s, e)]
    r = [x for s, e in zip(starts, ends) for x in range(s, e)]
    return (torch.tensor(b, dtype=torch.long, device=device),
            torch.tensor(r, dtype=torch.long, device=device))
