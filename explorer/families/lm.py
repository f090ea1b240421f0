"""`causal-lm`: a nanoGPT-style decoder, token ids (B, T) -> next-token logits (B, T, vocab).

Counted in closed form without torch; `build` imports the model (`_transformer.CausalLM`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from explorer.families import Family, register
from explorer.families._counts import BlockDims, block_flops, block_params, norm_params

if TYPE_CHECKING:
    from torch import nn


class LMDims(BlockDims):
    vocab: int = Field(256, ge=2, description="token ids (the task fixes it)")
    seq_len: int = Field(256, ge=1, description="context length (the task fixes it)")
    tie_weights: bool = Field(True, description="the LM head shares the token embedding's weights")


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
        from explorer.families._transformer import CausalLM

        return CausalLM(self.check(dims))
