"""The dimensions of explorer's own families, as validated data: the floor below both the families' counts
(`image.py`, `lm.py`, `sequence.py`) and the models built from them (`_transformer.py`), so that neither
imports the other's module to name them. Free of torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from explorer.families._counts import Act, BlockDims


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


class LMDims(BlockDims):
    vocab: int = Field(256, ge=2, description="token ids (the task fixes it)")
    seq_len: int = Field(256, ge=1, description="context length (the task fixes it)")
    tie_weights: bool = Field(True, description="the LM head shares the token embedding's weights")


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
