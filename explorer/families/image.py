"""`image-encoder`: a pre-norm ViT (patch embedding, class token or mean pool, linear head).

Counted in closed form without torch; `build` imports the model (`_transformer.ImageEncoder`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from explorer.families import Family, register
from explorer.families._counts import BlockDims, block_flops, block_params, linear_params, norm_params

if TYPE_CHECKING:
    from torch import nn


class ImageDims(BlockDims):
    img_size: int = Field(32, ge=1, description="input side in pixels (the task fixes it)")
    patch: int = Field(4, ge=1, description="patch side in pixels; it divides `img_size`")
    in_chans: int = Field(3, ge=1, description="input channels (the task fixes it)")
    num_classes: int = Field(10, ge=1, description="classes (the task fixes it)")
    pool: Literal["cls", "mean"] = Field("cls", description="the head reads a class token (`cls`) or the mean of the tokens")

    @model_validator(mode="after")
    def _patch_fits(self) -> "ImageDims":
        if self.img_size % self.patch:
            raise ValueError(f"patch {self.patch} must divide img_size {self.img_size}")
        return self

    def tokens(self) -> int:
        """Positions the blocks see: one per patch, and the class token."""
        return (self.img_size // self.patch) ** 2 + (self.pool == "cls")


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
            + d.tokens() * d.width
            + d.layers * block_params(d)
            + norm_params(d.width, d.bias)
            + linear_params(d.width, d.num_classes, d.bias)
        )

    def flops(self, dims: Dims) -> int:
        d = self.check(dims)
        patches = (d.img_size // d.patch) ** 2
        return (
            2 * patches * d.in_chans * d.patch**2 * d.width
            + d.layers * block_flops(d, d.tokens())
            + 2 * d.width * d.num_classes
        )

    def build(self, dims: Dims) -> nn.Module:
        from explorer.families._transformer import ImageEncoder

        return ImageEncoder(self.check(dims))
