"""`causal-lm`: a nanoGPT-style decoder, token ids (B, T) -> next-token logits (B, T, vocab)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from explorer.families import Family, register
from explorer.families._transformer import BlockDims, block_flops, block_params, blocks, init_weights, norm_params


class LMDims(BlockDims):
    vocab: int = Field(256, ge=2)
    seq_len: int = Field(256, ge=1)
    tie_weights: bool = True


class CausalLM(nn.Module):
    """Standard transformer init (`init_weights`): a fresh model's loss is near ln(vocab), tied or not."""

    def __init__(self, d: LMDims):
        super().__init__()
        self.tok_embed = nn.Embedding(d.vocab, d.width)
        self.pos_embed = nn.Parameter(torch.randn(1, d.seq_len, d.width) * 0.02)
        self.blocks = blocks(d, causal=True)
        self.norm = nn.LayerNorm(d.width, bias=d.bias)
        self.head = nn.Linear(d.width, d.vocab, bias=False)
        if d.tie_weights:
            self.head.weight = self.tok_embed.weight
        init_weights(self, d.layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_embed(ids) + self.pos_embed[:, : ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@register
class CausalLMFamily(Family):
    """Pre-norm causal decoder. Counting (closed form): token embedding vocab*width, learned positions
    seq_len*width, `layers` blocks (`block_params`), final LayerNorm, and a bias-free LM head
    width*vocab that is counted only when `tie_weights` is false (tied, it is the embedding).
    FLOPs: blocks on seq_len tokens (`block_flops`, full attention square) plus the head 2*seq_len*width*vocab.
    """

    name = "causal-lm"
    modality = "lm"
    counting = "closed-form"
    Dims = LMDims

    def params(self, dims: Dims) -> int:
        d = self.check(dims)
        return (
            d.vocab * d.width * (1 if d.tie_weights else 2)
            + d.seq_len * d.width
            + d.layers * block_params(d)
            + norm_params(d.width, d.bias)
        )

    def flops(self, dims: Dims) -> int:
        d = self.check(dims)
        return d.layers * block_flops(d, d.seq_len) + 2 * d.seq_len * d.width * d.vocab

    def build(self, dims: Dims) -> nn.Module:
        return CausalLM(self.check(dims))
