"""`sequence-classifier` (token ids -> class logits) and `crammed-bert`, the same model at BERT size."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from explorer.families import Family, register
from explorer.families._transformer import (
    Act,
    BlockDims,
    block_flops,
    block_params,
    blocks,
    init_weights,
    linear_params,
    norm_params,
)


class SequenceDims(BlockDims):
    vocab: int = Field(256, ge=2)
    seq_len: int = Field(512, ge=1)
    num_classes: int = Field(10, ge=1)
    pool: Literal["cls", "mean"] = "cls"


class CrammedBertDims(SequenceDims):
    """Crammed BERT (Geiping & Goldstein 2023): hidden 768, GLU MLP 3072, no biases, vocab 32768."""

    layers: int = Field(16, ge=1)
    heads: int = Field(12, ge=1)
    width: int = Field(768, ge=1)
    mlp: int = Field(3072, ge=1)
    act: Act = "glu"
    bias: bool = False
    vocab: int = Field(32768, ge=2)
    seq_len: int = Field(128, ge=1)
    num_classes: int = Field(2, ge=1)


class SequenceClassifier(nn.Module):
    """Token 0 is padding: attention ignores padded keys and mean pooling skips them.

    Standard transformer init (`init_weights`); position embedding N(0, 0.02), class token 0.
    """

    def __init__(self, d: SequenceDims):
        super().__init__()
        self.tok_embed = nn.Embedding(d.vocab, d.width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d.width)) if d.pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.randn(1, _tokens(d), d.width) * 0.02)
        self.blocks = blocks(d)
        self.norm = nn.LayerNorm(d.width, bias=d.bias)
        self.head = nn.Linear(d.width, d.num_classes, bias=d.bias)
        init_weights(self, d.layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != 0
        x = self.tok_embed(ids)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
            keep = torch.cat([keep.new_ones(len(x), 1), keep], dim=1)
        else:
            keep = keep.clone()
            keep[:, 0] = True  # an all-padding row would give attention nothing to attend to
        x = x + self.pos_embed[:, : x.shape[1]]
        for block in self.blocks:
            x = block(x, keep)
        x = self.norm(x)
        if self.cls_token is not None:
            return self.head(x[:, 0])
        w = keep.unsqueeze(-1).to(x.dtype)
        return self.head((x * w).sum(1) / w.sum(1))


def _tokens(d: SequenceDims) -> int:
    return d.seq_len + (d.pool == "cls")


def _params(d: SequenceDims) -> int:
    return (
        d.vocab * d.width
        + (d.width if d.pool == "cls" else 0)
        + _tokens(d) * d.width
        + d.layers * block_params(d)
        + norm_params(d.width, d.bias)
        + linear_params(d.width, d.num_classes, d.bias)
    )


def _flops(d: SequenceDims) -> int:
    return d.layers * block_flops(d, _tokens(d)) + 2 * d.width * d.num_classes


@register
class SequenceClassifierFamily(Family):
    """Pre-norm encoder over token ids. Counting (closed form): token embedding vocab*width, class
    token width (pool cls), learned positions (seq_len [+1 for cls])*width, `layers` blocks
    (`block_params`), final LayerNorm, head width*num_classes (+num_classes bias).
    FLOPs: the blocks on all seq_len (+1) positions (`block_flops`) and the head; lookups are free.
    """

    name = "sequence-classifier"
    modality = "sequence"
    counting = "closed-form"
    Dims = SequenceDims

    def params(self, dims: Dims) -> int:
        return _params(self.check(dims))

    def flops(self, dims: Dims) -> int:
        return _flops(self.check(dims))

    def build(self, dims: Dims) -> nn.Module:
        return SequenceClassifier(self.check(dims))


@register
class CrammedBertFamily(SequenceClassifierFamily):
    """The sequence classifier at Crammed BERT's size, so the seed's BERT rows can be counted.

    Defaults: 16 layers, 12 heads, hidden 768, GLU MLP 3072 (fc2 takes 1536), no linear or LayerNorm
    biases, vocab 32768, seq_len 128, learned positions, and a classification head (768 x 2, no MLM
    head). Counting is the sequence classifier's closed form: 16 layers/12 heads = 119.66M, 10
    layers/24 heads = 84.27M (the paper's 119M and 84M; heads add no parameters).
    """

    name = "crammed-bert"
    Dims = CrammedBertDims
