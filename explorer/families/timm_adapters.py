"""Adapters onto timm's ViT, DeiT, XCiT, DaViT and TNT: the only module in explorer that imports timm.

Each maps explorer's dimensions onto `timm.create_model(model, pretrained=False, **kwargs)`; anything
left unset (None) keeps the named model's own value. Counting builds the model on the `meta` device
(no memory, no weights) and caches the result per configuration on disk (`_disk_cache`: a space's
counts cost seconds of building the first time only): a closed form for five timm architectures
would duplicate timm's internals and drift from them. FLOPs are counted the same way,
by torch's FlopCounterMode over a meta-device forward of one image (matmuls, convolutions and
attention, 2 per multiply-add), so they are exact for the built model rather than an estimate.
"""

from __future__ import annotations

import difflib
import functools
import json
from types import ModuleType
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

from explorer.families import Dims, Family, register
from explorer.families._disk_cache import DiskCounts
from explorer.families._counts import check_heads

Kwargs = tuple[tuple[str, Any], ...]
_COUNTS = DiskCounts()  # parameter counts, FLOPs and default widths, by model and kwargs


def _timm() -> ModuleType:
    """timm, imported on first use: it imports torchvision (seconds), which commands that touch no
    timm family (`status`, `params` of an own family) should not pay for."""
    import timm

    return timm


class TimmDims(BaseModel):
    """`layers` -> depth, `heads` -> attention heads; `width` (embed dim) and `mlp` (MLP hidden width)
    override the named model's when set."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="the timm model whose depth and heads move, e.g. `vit_small_patch16_224`")
    layers: int = Field(ge=1, description="depth (timm's `depth`)")
    heads: int = Field(ge=1, description="attention heads (timm's `num_heads`)")
    width: int | None = Field(None, ge=1, description="embed dim; null: the named model's")
    mlp: int | None = Field(None, ge=1, description="the MLP's hidden width; null: the named model's")
    img_size: int = Field(224, ge=1, description="input side in pixels (the task fixes it)")
    in_chans: int = Field(3, ge=1, description="input channels (the task fixes it)")
    num_classes: int = Field(1000, ge=1, description="classes (the task fixes it)")

    prefix: ClassVar[str]

    @field_validator("model")
    @classmethod
    def _known(cls, model: str) -> str:
        """A model of this family, or one line saying what is wrong: another family's model, or a typo."""
        if model.startswith(cls.prefix) and _timm().is_model(model):
            return model
        example = cls.model_fields["model"].default
        if _timm().is_model(model):
            families = TimmFamily.__subclasses__()
            other = next((f.name for f in families if model.startswith(f.Dims.prefix)), None)
            fix = f"set family: {other}" if other else "explorer's timm families: " + ", ".join(f"{f.name} ({f.Dims.prefix}*)" for f in families)
            raise ValueError(f"model {model!r} is not a {cls.prefix}* model, the ones whose depth and heads this "
                             f"family varies (e.g. {example}); {fix}")
        close = difflib.get_close_matches(model, _timm().list_models(f"{cls.prefix}*"), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"see timm.list_models('{cls.prefix}*'), e.g. {example}"
        raise ValueError(f"model {model!r} is not a timm model; {hint}")

    @model_validator(mode="after")
    def _fits(self) -> "TimmDims":
        check_heads(self.resolved_width(), self.heads)
        return self

    def resolved_width(self) -> int:
        """`width`, or the named model's embed dim (DaViT: its first stage's)."""
        if self.width is not None:
            return self.width

        def default_width() -> int:
            net = _meta_default(self.model)
            return net.embed_dim if hasattr(net, "embed_dim") else net.stem.conv.out_channels

        return _COUNTS.get(f"width {self.model}", default_width)


class PatchDims(TimmDims):
    """Single-scale models: `patch` overrides the named model's patch size."""

    patch: int | None = Field(None, ge=1, description="patch size; null: the named model's")


class VitDims(PatchDims):
    model: str = "vit_small_patch16_224"
    prefix = "vit_"


class DeitDims(PatchDims):
    model: str = "deit_small_patch16_224"
    prefix = "deit_"


class XcitDims(PatchDims):
    model: str = "xcit_medium_24_p16_224"
    prefix = "xcit_"


class TntDims(PatchDims):
    model: str = "tnt_b_patch16_224"
    prefix = "tnt_"


class DavitDims(TimmDims):
    """DaViT has four stages: `layers` is the depth of the deep third stage, `stage1_depth`,
    `stage2_depth` and `stage4_depth` the others; `heads` and `width` are the first stage's, doubled
    at each stage as DaViT does (davit_base: depths (1, 1, 9, 1), heads (4, 8, 16, 32), widths
    (128, ..., 1024)). DaViT takes any input size, so `img_size` only sets the FLOPs input, and its
    stem fixes the patch."""

    model: str = "davit_base"
    prefix = "davit_"
    stage1_depth: int = Field(1, ge=1, description="blocks of the first stage")
    stage2_depth: int = Field(1, ge=1, description="blocks of the second stage")
    stage4_depth: int = Field(1, ge=1, description="blocks of the fourth stage")


class _NoInit(torch.overrides.TorchFunctionMode):
    """The in-place initialisers timm's models call in their constructors, skipped on meta tensors: a meta
    tensor holds no values to set, and torch still runs each such op's shape checks in Python (`clamp_`
    alone 4 ms a call: half a minute of building a few dozen XCiTs). None of these ops changes a shape."""

    SKIP = frozenset({torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.erfinv_, torch.Tensor.clamp_,
                      torch.Tensor.mul_, torch.Tensor.add_, torch.Tensor.sub_, torch.Tensor.div_, torch.Tensor.fill_,
                      torch.Tensor.zero_, torch.Tensor.copy_})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in self.SKIP and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))


def _on_meta(model: str, **kwargs: Any) -> nn.Module:
    """timm's `model` built on the meta device, its initialisation skipped (counting needs only its shapes)."""
    with torch.device("meta"), _NoInit():
        return _timm().create_model(model, pretrained=False, **kwargs)


@functools.lru_cache(maxsize=None)
def _meta_default(model: str) -> nn.Module:
    """The named model as timm defines it, on the meta device: where unset dims read their defaults."""
    return _on_meta(model)


def _meta_params(model: str, kwargs: Kwargs) -> int:
    def count() -> int:
        net = _on_meta(model, **dict(kwargs))
        return sum(p.numel() for p in net.parameters())

    return _COUNTS.get(f"params {model} {json.dumps(kwargs)}", count)


def _meta_flops(model: str, kwargs: Kwargs, in_chans: int, img_size: int) -> int:
    def count() -> int:
        from torch.utils.flop_counter import FlopCounterMode  # imports triton where installed: a quarter second

        net = _on_meta(model, **dict(kwargs))
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            net(torch.empty(1, in_chans, img_size, img_size, device="meta"))
        return int(counter.get_total_flops())

    return _COUNTS.get(f"flops {model} {json.dumps(kwargs)} {in_chans} {img_size}", count)


class TimmFamily(Family):
    """A single-scale timm family (ViT-like); its Dims name the model prefix, `_kwargs` maps dims onto timm's."""

    modality = "image"
    counting = "meta-device (cached)"
    heads_kwarg: ClassVar[str] = "num_heads"

    def _kwargs(self, d: Any) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "depth": d.layers,
            self.heads_kwarg: d.heads,
            "img_size": d.img_size,
            "in_chans": d.in_chans,
            "num_classes": d.num_classes,
        }
        if d.width is not None:
            kw["embed_dim"] = d.width
        if d.patch is not None:
            kw["patch_size"] = d.patch
        if d.mlp is not None:  # timm sizes the MLP as int(dim * mlp_ratio); the epsilon keeps int() exact
            kw["mlp_ratio"] = d.mlp / d.resolved_width() + 1e-9
        return kw

    def _key(self, dims: Dims) -> tuple[str, Kwargs, Any]:
        d = self.check(dims)
        return d.model, tuple(sorted(self._kwargs(d).items())), d

    def params(self, dims: Dims) -> int:
        model, kwargs, _ = self._key(dims)
        return _meta_params(model, kwargs)

    def flops(self, dims: Dims) -> int:
        model, kwargs, d = self._key(dims)
        return _meta_flops(model, kwargs, d.in_chans, d.img_size)

    def build(self, dims: Dims) -> nn.Module:
        model, kwargs, _ = self._key(dims)
        return _timm().create_model(model, pretrained=False, **dict(kwargs))


@register
class TimmVit(TimmFamily):
    """timm VisionTransformer (`vit_*`): depth, num_heads, embed_dim, mlp_ratio, patch_size. Meta-device count."""

    name = "timm-vit"
    Dims = VitDims


@register
class TimmDeit(TimmFamily):
    """timm DeiT (`deit_*`, a VisionTransformer; distilled variants add a distillation token). Meta-device count."""

    name = "timm-deit"
    Dims = DeitDims


@register
class TimmXcit(TimmFamily):
    """timm XCiT (`xcit_*`): `layers` counts the XCA blocks; the two class-attention layers stay. The
    per-head temperature makes heads add a few parameters. Patch 8 or 16 only. Meta-device count."""

    name = "timm-xcit"
    Dims = XcitDims


@register
class TimmTnt(TimmFamily):
    """timm TNT (`tnt_*`): `heads` are the outer (patch-level) heads; the inner (pixel-level) heads and
    inner dim keep the named model's values. `mlp` sets mlp_ratio, which timm applies to the inner
    MLP too. Meta-device count."""

    name = "timm-tnt"
    heads_kwarg = "num_heads_outer"
    Dims = TntDims


@register
class TimmDavit(TimmFamily):
    """timm DaViT (`davit_*`); how layers/heads/width map onto the four stages: see `DavitDims`.
    `mlp` is the first stage's MLP hidden width (the ratio holds in every stage). Meta-device count."""

    name = "timm-davit"
    Dims = DavitDims

    def _kwargs(self, d: Any) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "depths": (d.stage1_depth, d.stage2_depth, d.layers, d.stage4_depth),
            "num_heads": tuple(d.heads * 2**i for i in range(4)),
            "in_chans": d.in_chans,
            "num_classes": d.num_classes,
        }
        if d.width is not None:
            kw["embed_dims"] = tuple(d.width * 2**i for i in range(4))
        if d.mlp is not None:
            kw["mlp_ratio"] = d.mlp / d.resolved_width() + 1e-9
        return kw
