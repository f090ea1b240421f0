"""`sequence-classifier` (token ids -> class logits) and `crammed-bert`, the same model at BERT size.

Counted in closed form without torch; `build` imports the model (`_transformer.SequenceClassifier`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.families import Family, register
from explorer.families._counts import block_flops, block_params, linear_params, norm_params
from explorer.families._dims import CrammedBertDims, SequenceDims

if TYPE_CHECKING:
    from torch import nn


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
