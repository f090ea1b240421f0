"""`image-encoder`: a pre-norm ViT (patch embedding, class token or mean pool, linear head)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from explorer.families import Family, register
from explorer.families._transformer import (
    BlockDims,
    block_flops,
    block_params,
    blocks,
    init_weights,
    linear_params,
    norm_params,
)


class ImageDims(BlockDims):
    img_size: int = Field(32, ge=1)
    patch: int = Field(4, ge=1)
    in_chans: int = Field(3, ge=1)
    num_classes: int = Field(10, ge=1)
    pool: Literal["cls", "mean"] = "cls"

    @model_validator(mode="after")
    def _patch_fits(self) -> "ImageDims":
        if self.img_size % self.patch:
            raise ValueError(f"patch {self.patch} must divide img_size {self.img_size}")
        return self


class ImageEncoder(nn.Module):
    """Standard transformer init (`init_weights`); position embedding N(0, 0.02), class token 0."""

    def __init__(self, d: ImageDims):
        super().__init__()
        self.patch_embed = nn.Conv2d(d.in_chans, d.width, d.patch, stride=d.patch, bias=d.bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d.width)) if d.pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.randn(1, _tokens(d), d.width) * 0.02)
        self.blocks = blocks(d)
        self.norm = nn.LayerNorm(d.width, bias=d.bias)
        self.head = nn.Linear(d.width, d.num_classes, bias=d.bias)
        init_weights(self, d.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
        x = x + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.cls_token is not None else x.mean(dim=1))


def _tokens(d: ImageDims) -> int:
    return (d.img_size // d.patch) ** 2 + (d.pool == "cls")


@register
class ImageEncoderFamily(Family):
    """Pre-norm ViT. Counting (closed form): patch conv in_chans*patch^2*width (+width bias), class
    token width (pool cls), position embedding tokens*width, `layers` blocks (`block_params`), final
    LayerNorm, head width*num_classes (+num_classes bias). Every bias and LayerNorm bias follows `bias`.
    FLOPs: patch conv, the blocks on all tokens (`block_flops`), and the head.
    """

    name = "image-encoder"
    modality = "image"
    counting = "closed-form"
    Dims = ImageDims

    def params(self, dims: Dims) -> int:
        d = self.check(dims)
        return (
            d.in_chans * d.patch**2 * d.width + (d.width if d.bias else 0)
            + (d.width if d.pool == "cls" else 0)
            + _tokens(d) * d.width
            + d.layers * block_params(d)
            + norm_params(d.width, d.bias)
            + linear_params(d.width, d.num_classes, d.bias)
        )

    def flops(self, dims: Dims) -> int:
        d = self.check(dims)
        patches = (d.img_size // d.patch) ** 2
        return (
            2 * patches * d.in_chans * d.patch**2 * d.width
            + d.layers * block_flops(d, _tokens(d))
            + 2 * d.width * d.num_classes
        )

    def build(self, dims: Dims) -> nn.Module:
        return ImageEncoder(self.check(dims))
