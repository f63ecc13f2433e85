"""Length-grouped attention for CPU inference: the sequences of an unpadded batch sorted by length and cut into a few
groups, each padded only to its own longest sequence, with attention written out or on sdpa per group."""

import torch
from torch import nn

from ..attention_backends import UnpaddedBatch, additive_mask


# How an optimized encoder computes attention over its length groups (`CpuInferencePlan.attention`):
ATTENTION_MODES = {
    "written_out": "fp32 length groups of at most `LengthGroups.written_out_limit` keys as softmax(Q K^T + mask) "
    "V in two batched matrix products; longer groups and other dtypes on sdpa",
    "sdpa": "every group on torch's `scaled_dot_product_attention` (its CPU flash kernel)",
}
# The numbers of length groups a plan may choose (`CpuInferencePlan.length_groups`).
LENGTH_GROUPS = (1, 2, 4, 8)


class LengthGroups:
    """
    The sequences of an unpadded batch sorted by length and cut into at most `max_groups` groups, each laid out
    (S_g, L_g) with L_g its longest sequence, so that attention computes less on padding than in one (S, L_max) grid:
    with real-length snippets (48 % padding) and 4 groups the padded attention area falls by about half. Our own trick
    (the idea of bucketing by length, applied inside one batch); results per sequence are those of
    `torch.nn.functional.scaled_dot_product_attention` on a shorter padding, equal up to the order of its sums.

    The grouped layout is gathered from the real tokens, a padding row repeating its sequence's first token, as in
    `UnpaddedBatch.to_attention_layout`.

    Args:
        unpadded (`UnpaddedBatch`): the batch, with its attention layout.
        max_groups (`int`): at most this many groups (one per sequence at most).
        max_keys_written_out (`int`): fp32 groups of at most this many keys compute attention written out (see
            `attend`); 0: every group on sdpa.

    Attributes:
        rows (`torch.LongTensor` of shape `(T,)`): each real token's row in the grouped layout (all groups' grids
            flattened one after the other).
        sources (`torch.LongTensor` of shape `(total_rows,)`): the real token each row of the grouped layout holds
            (after a sequence's end, that sequence's first token).
        groups (`list[tuple[int, int, int, torch.Tensor, torch.Tensor]]`): per group its first row, S_g, L_g, its key
            mask (S_g, 1, 1, L_g), True at real tokens, and the same as an additive fp32 mask.
    """

    # The longest group (keys) whose fp32 attention the "written_out" mode writes out: beyond about 72 keys the
    # written-out products slowed down by up to 3x on some lengths (2026-11-27, AMD EPYC Zen 5, torch 2.13.0).
    written_out_limit = 64

    def __init__(self, unpadded: UnpaddedBatch, max_groups: int = 4, max_keys_written_out: int = written_out_limit):
        self.max_keys_written_out = max_keys_written_out
        mask = unpadded.attention_mask  # (S, L_max)
        num_sequences, max_length = mask.shape
        lengths = mask.sum(1)  # (S,)
        order = torch.argsort(lengths, descending=True, stable=True)
        count = min(max_groups, num_sequences)
        bounds = [round(i * num_sequences / count) for i in range(count + 1)]
        place = torch.empty(num_sequences, dtype=torch.long)  # each sequence's first row in the grouped layout
        sorted_lengths = lengths[order].tolist()
        attention_sources = unpadded.attention_sources.view(num_sequences, max_length)
        self.groups, sources, first_row = [], [], 0
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            size, width = end - start, sorted_lengths[start]
            place[order[start:end]] = first_row + torch.arange(size) * width
            key_mask = (torch.arange(width) < lengths[order[start:end], None])[:, None, None, :]
            self.groups.append((first_row, size, width, key_mask, additive_mask(key_mask)))
            sources.append(attention_sources[order[start:end], :width].reshape(-1))
            first_row += size * width
        self.total_rows = first_row
        self.sources = torch.cat(sources)
        sequence, offset = unpadded.attention_indices // max_length, unpadded.attention_indices % max_length
        self.rows = place[sequence] + offset

    @classmethod
    def for_mode(cls, unpadded: UnpaddedBatch, max_groups: int, attention: str) -> "LengthGroups":
        """The groups an `ATTENTION_MODES` mode runs: "written_out" writes out the fp32 groups of at most
        `written_out_limit` keys, "sdpa" none."""
        return cls(unpadded, max_groups, cls.written_out_limit if attention == "written_out" else 0)

    def attend(self, qkv: torch.Tensor, attention) -> torch.Tensor:
        """
        (1, T, 3H) fused query/key/value projections of the real tokens -> (1, T, H) heads side by side.

        In fp32, a group of at most `max_keys_written_out` keys computes softmax(Q Kᵀ · scaling + mask) V as written
        ("Attention Is All You Need" §3.2.1, what BERT's eager attention computes): two batched matrix products
        around a softmax. Other groups run sdpa's CPU flash kernel. Which is faster depends on the CPU and the thread
        count (on an AMD EPYC Zen 5 with real-length batches, 2026-11-27: the fp32 flash kernel gained only 1.0-1.4x
        from a second thread, the written-out products 1.7-1.9x, and on one thread the kernel was a few per cent
        faster), so `optimize_for_cpu_inference` times both (`CpuInferencePlan.attention`).
        """
        hidden = qkv.shape[-1] // 3
        laid_out = torch.index_select(qkv[0], 0, self.sources)  # (total_rows, 3H)
        output = qkv.new_empty(self.total_rows, hidden)
        longest_written_out = self.max_keys_written_out if qkv.dtype == torch.float32 else 0
        for first_row, size, width, key_mask, key_bias in self.groups:
            block = laid_out[first_row : first_row + size * width].view(size, width, 3 * hidden)
            query, key, value = split_qkv(block, attention)  # (S_g, N, L_g, D) each
            if width <= longest_written_out:
                scores = torch.matmul(query, key.transpose(-1, -2))  # (S_g, N, L_g, L_g)
                heads = torch.matmul(torch.add(key_bias, scores, alpha=attention.scaling).softmax(-1), value)
            else:
                heads = nn.functional.scaled_dot_product_attention(
                    query, key, value, attn_mask=key_mask, scale=attention.scaling
                )  # (S_g, N, L_g, D)
            output[first_row : first_row + size * width].view(size, width, hidden).copy_(
                heads.transpose(1, 2).reshape(size, width, hidden)
            )
        return torch.index_select(output, 0, self.rows).unsqueeze(0)


def split_qkv(qkv: torch.Tensor, attention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, L, 3H) fused projections -> query, key, value, each (B, N, L, D) (strided views, no copy)."""
    return qkv.view(*qkv.shape[:2], 3, attention.num_heads, attention.head_dim).permute(2, 0, 3, 1, 4)
