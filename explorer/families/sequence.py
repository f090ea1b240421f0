"""`sequence-classifier` (token ids -> class logits) and `crammed-bert`, the same model at BERT size.

Counted in closed form without torch; `build` imports the model (`_transformer.SequenceClassifier`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from explorer.families import Family, register
from explorer.families._counts import Act, BlockDims, block_flops, block_params, linear_params, norm_params

if TYPE_CHECKING:
    from torch import nn


class SequenceDims(BlockDims):
    vocab: int = Field(256, ge=2, description="token ids (the task fixes it)")
    seq_len: int = Field(512, ge=1, description="positions (the task fixes it)")
    num_classes: int = Field(10, ge=1, description="classes (the task fixes it)")
    pool: Literal["cls", "mean"] = Field("cls", description="the head reads a class token (`cls`) or the mean of the tokens")

    def tokens(self) -> int:
        """Positions the blocks see: seq_len, and the class token."""
        return self.seq_len + (self.pool == "cls")


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


def _params(d: SequenceDims) -> int:
    return (
        d.vocab * d.width
        + (d.width if d.pool == "cls" else 0)
        + d.tokens() * d.width
        + d.layers * block_params(d)
        + norm_params(d.width, d.bias)
        + linear_params(d.width, d.num_classes, d.bias)
    )


def _flops(d: SequenceDims) -> int:
    return d.layers * block_flops(d, d.tokens()) + 2 * d.width * d.num_classes


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
        from explorer.families._transformer import SequenceClassifier

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
