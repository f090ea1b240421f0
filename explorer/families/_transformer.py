"""Pre-norm transformer blocks shared by explorer's own families (nanoGPT-style), and their counts.

Every own family is initialised the standard transformer way (`init_weights`, as nanoGPT and timm's
ViT do), so that κ and accuracy compare across families and a tied LM head starts near zero logits.

Each module here has a twin counting function (`block_params`, `block_flops`) so the families can
count a configuration without building it; tests check the two against each other.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

Act = Literal["gelu", "glu"]


class BlockDims(BaseModel):
    """The dimensions every block-stack family shares; heads must divide width, GLU needs an even mlp."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    width: int = Field(ge=1)
    mlp: int = Field(ge=1)
    act: Act = "gelu"
    bias: bool = True

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


class Attention(nn.Module):
    """Multi-head self-attention. `proj`'s input is the concatenated head outputs (B, N, width)."""

    def __init__(self, width: int, heads: int, bias: bool, causal: bool = False):
        super().__init__()
        check_heads(width, heads)
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`key_mask` (B, N) bool, True where a token may be attended to (padding is False)."""
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class MLP(nn.Module):
    """GELU MLP, or Crammed BERT's GLU: Linear(width, mlp) split in halves a, b -> gelu(a) * b."""

    def __init__(self, width: int, mlp: int, act: Act, bias: bool):
        super().__init__()
        self.act = act
        self.fc1 = nn.Linear(width, mlp, bias=bias)
        self.fc2 = nn.Linear(mlp // 2 if act == "glu" else mlp, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.act == "glu":
            a, b = h.chunk(2, dim=-1)
            return self.fc2(F.gelu(a) * b)
        return self.fc2(F.gelu(h))


class Block(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, mlp: int, act: Act, bias: bool, causal: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=bias)
        self.attn = Attention(width, heads, bias, causal)
        self.ln2 = nn.LayerNorm(width, bias=bias)
        self.mlp = MLP(width, mlp, act, bias)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), key_mask)
        return x + self.mlp(self.ln2(x))


def blocks(d: BlockDims, causal: bool = False) -> nn.ModuleList:
    return nn.ModuleList(Block(d.width, d.heads, d.mlp, d.act, d.bias, causal) for _ in range(d.layers))


INIT_STD = 0.02  # GPT-2 / nanoGPT / timm ViT


def init_weights(model: nn.Module, layers: int) -> None:
    """Standard transformer init: Linear and Embedding weights N(0, 0.02), biases 0, LayerNorm 1/0,
    and the residual output projections (attention `proj`, MLP `fc2`) N(0, 0.02 / sqrt(2 * layers)),
    so the residual stream's variance does not grow with depth (nanoGPT, GPT-2). Convolutions
    (the image patch embedding) keep PyTorch's default, as timm's ViT does. A head tied to the token
    embedding shares its N(0, 0.02) weights, so a fresh LM's logits are near zero (loss near ln vocab).
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, Block):
            for residual_out in (module.attn.proj, module.mlp.fc2):
                nn.init.normal_(residual_out.weight, 0.0, INIT_STD / math.sqrt(2 * layers))


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
