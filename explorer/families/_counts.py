"""The dimensions explorer's own block-stack families share, and their closed-form counts, free of torch.

`explorer params` of an own family and everything that only validates or counts a space (status,
export, recommend) read this module and never import torch; the blocks these counts describe are
built in `_transformer.py`, and tests check each count against the built model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Act = Literal["gelu", "glu"]


class BlockDims(BaseModel):
    """The dimensions every block-stack family shares; heads must divide width, GLU needs an even mlp."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(ge=1, description="transformer blocks")
    heads: int = Field(ge=1, description="attention heads per block; they divide the width")
    width: int = Field(ge=1, description="the model width (embedding dimension)")
    mlp: int = Field(ge=1, description="the MLP's hidden width")
    act: Act = Field("gelu", description="the MLP: `gelu`, or `glu` (GELU-gated, `mlp` split in two halves)")
    bias: bool = Field(True, description="biases in the linear layers and norms")

    @model_validator(mode="after")
    def _shapes_fit(self) -> "BlockDims":
        check_heads(self.width, self.heads)
        if self.act == "glu" and self.mlp % 2:
            raise ValueError(f"act glu splits mlp in two halves: mlp {self.mlp} must be even")
        return self


def check_heads(width: int, heads: int) -> None:
    """Raise ValueError unless `heads` divides `width` (every head gets width // heads channels)."""
    if heads < 1 or width % heads:
        raise ValueError(f"heads {heads} must divide width {width}")


def norm_params(width: int, bias: bool) -> int:
    return width * (2 if bias else 1)


def linear_params(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _mlp_out_in(d: BlockDims) -> int:
    return d.mlp // 2 if d.act == "glu" else d.mlp


def block_params(d: BlockDims) -> int:
    """Parameters of one Block: two LayerNorms, qkv, proj, fc1, fc2 (biases per `d.bias`)."""
    w, b = d.width, d.bias
    return (
        2 * norm_params(w, b)
        + linear_params(w, 3 * w, b)
        + linear_params(w, w, b)
        + linear_params(w, d.mlp, b)
        + linear_params(_mlp_out_in(d), w, b)
    )


def block_flops(d: BlockDims, tokens: int) -> int:
    """Forward matmul FLOPs of one Block on `tokens` tokens: 2 per multiply-add.

    Projections: 2 * tokens * (weights of qkv, proj, fc1, fc2). Attention: QK^T and AV each cost
    tokens^2 * width multiply-adds; the causal mask is not discounted (SDPA computes the full square).
    """
    w = d.width
    weights = 3 * w * w + w * w + w * d.mlp + _mlp_out_in(d) * w
    return 2 * tokens * weights + 4 * tokens * tokens * w
