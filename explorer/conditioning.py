"""Condition numbers of attention blocks on real inputs: κ(A) = σ₁(A) / σ_k(A).

Which matrix. A is the concatenation of one block's head outputs [A_1 X W_V1, ..., A_h X W_Vh]
(N tokens x D width) for one input, the matrix Theorem 3.2 of Saratchandran, Teney and Lucey
(arXiv 2505.20802) is about. In explorer's families and in timm (Attention, XCA, ChannelAttention,
WindowAttention, TNT's Attention) it is exactly the input of the attention module's `proj` Linear,
so a forward pre-hook on `proj` captures it, shape (..., N, D). Leading dimensions index independent
matrices: one per sample, or per sample and window (DaViT's WindowAttention), or per sample and
patch (TNT's inner attention). Rows of padding tokens are left out: an attention module that takes
a `key_mask` (B, N) bool, True for real tokens (explorer's sequence families do), gives the rows to
keep. transformers' modules take an additive mask instead, so hf-bert's padding rows are still in A.

Which k. k = min(N, D), the number of singular values A has: σ_N where N <= D (the theorem's
setting, D >> N), the full-rank condition number where N > D (long LM contexts). κ = inf when A is
rank-deficient on an input (numpy's rank rule in float64); such blocks are kept, never dropped from
a mean. A is captured in the model's dtype (float32) and analysed in float64, so a κ above about
1e7 (float32's 1/eps is 8.4e6) is at the capture's resolution and reads as a lower bound: digits,
width 64, one head, κ 6.5e7 from float32 and 1.5e8 from a float64 model; at two heads and more the
two agree.

What it measures, and what it does not. The theorem compares A with a Gaussian N x D matrix, whose
κ ≈ (√D + √N) / (√D - √N) depends on D and N only: at fixed width D it predicts κ independent of
the number of heads, and a fall with heads only at fixed head dimension (D = heads x head_dim).
explorer measures a steep fall with heads at fixed width at initialisation (digits, width 64, 17
tokens: 6.8e7 at 1 head to 4.2e4 at 8, where the Gaussian value is 3.1 throughout). That fall has
another cause: attention at initialisation is close to uniform, so each head's output A_i X W_Vi is
close to rank one (every row near the mean of the values). So every κ carries its regime
("fixed-width" or "fixed-head-dim", `space_regime`), and `condition_table` sweeps both.

Which blocks. Each block is labelled with its attention kind: "token" (attention over tokens:
explorer's, ViT/DeiT, DaViT's windows, TNT's outer), "channel" (XCiT's XCA and DaViT's
ChannelAttention attend over channels) and "inner" (TNT's pixel-level attention, whose heads a
space never varies). The summary κ of a model is over its token-attention blocks; every block is
kept with its name and kind, and a block whose hook never fired is reported with κ None (missing).

Per block, κ is the (lower) median over the batch of the per-matrix values, computed in float64 on
the CPU: medians, because a few degenerate inputs (a blank digit) would dominate a mean of ratios.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from explorer.errors import ExplorerError
from explorer.families import Family
from explorer.kappa import REGIMES, BlockKappa, Kind, Regime, geometric_mean, resolved_width, summary

if TYPE_CHECKING:
    from explorer.space import SearchSpace
    from explorer.tasks import Task

# Attention classes whose names lack "Attention": timm XCiT's cross-covariance attention.
_OTHER_ATTENTION_CLASSES = {"XCA"}
_CHANNEL_ATTENTION_CLASSES = {"XCA", "ChannelAttention", "ChannelAttentionV2"}


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(name, module)` of each attention module with a `proj` projection, in the model's order."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if ("Attention" in type(module).__name__ or type(module).__name__ in _OTHER_ATTENTION_CLASSES)
        and isinstance(getattr(module, "proj", None), nn.Module)  # a Linear, or GPT-2's Conv1D
    ]


def attention_kind(name: str, module: nn.Module) -> Kind:
    """What a block attends over: channels (XCA, ChannelAttention), TNT's inner pixels, or tokens."""
    if type(module).__name__ in _CHANNEL_ATTENTION_CLASSES:
        return "channel"
    if name.rsplit(".", 1)[-1] == "attn_in":  # timm TNT: `attn_in` pixels within a patch, `attn_out` patches
        return "inner"
    return "token"


def _kappa(matrix: torch.Tensor) -> torch.Tensor:
    """σ₁/σ_k of each trailing (N, D) float64 matrix; inf where it is rank-deficient (the zero matrix
    too), by numpy's `matrix_rank` rule: σ_k <= σ₁ · max(N, D) · eps."""
    sigma = torch.linalg.svdvals(matrix)  # descending, min(N, D) values per matrix
    largest, smallest = sigma[..., 0], sigma[..., -1]
    deficient = smallest <= largest * max(matrix.shape[-2:]) * torch.finfo(matrix.dtype).eps
    return torch.where(deficient, torch.full_like(smallest, math.inf), largest / smallest)


def condition_number(a: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """Median over the leading dims of σ₁/σ_k of the trailing (N, D) matrices, k = min(N, D).

    `rows` (B, N) bool, with a of shape (B, N, D), keeps only the True rows of each sample's matrix
    (so k = min(real tokens, D)).
    """
    matrices = a.detach().to("cpu", torch.float64).reshape(-1, *a.shape[-2:])
    if rows is None:
        kappas = _kappa(matrices)
    else:
        keep = rows.detach().to("cpu", torch.bool).reshape(-1, a.shape[-2])
        kappas = torch.stack([_kappa(m[r]) for m, r in zip(matrices, keep, strict=True)])
    return float(kappas.median())


def _key_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """explorer's `key_mask`: (B, N) bool, True for real tokens. Other masks (transformers' additive
    4-D ones) are not read: their padding rows stay in A."""
    mask = kwargs.get("key_mask", args[1] if len(args) > 1 else None)
    ok = isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.ndim == 2
    return mask if ok else None


@torch.no_grad()
def attention_condition(model: nn.Module, batch_x: torch.Tensor, exclude_padding: bool = True) -> list[BlockKappa]:
    """κ(A) of each attention block's multi-head output on `batch_x`, in the model's order.

    Every attention module gets an entry, labelled with its kind; one whose `proj` never ran has κ
    None. Padding rows are left out unless `exclude_padding` is false (to see what they would do).
    Runs one forward pass in eval mode (restoring the mode after) on the model's device.
    """
    modules = attention_modules(model)
    captured: dict[int, torch.Tensor] = {}
    masks: dict[int, torch.Tensor] = {}

    def capture_mask(index: int):
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            mask = _key_mask(args, kwargs)
            if exclude_padding and mask is not None and index not in masks:
                masks[index] = mask

        return hook

    def capture(index: int):
        def hook(_proj: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            captured.setdefault(index, inputs[0])

        return hook

    handles = []
    for i, (_, module) in enumerate(modules):
        handles.append(module.register_forward_pre_hook(capture_mask(i), with_kwargs=True))
        handles.append(module.proj.register_forward_pre_hook(capture(i)))
    was_training = model.training
    device = next(model.parameters()).device
    try:
        model.eval()
        model(batch_x.to(device))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [
        BlockKappa(
            name=name,
            kind=attention_kind(name, module),
            kappa=condition_number(captured[i], masks.get(i)) if i in captured else None,
        )
        for i, (name, module) in enumerate(modules)
    ]


def _fixed_head_dim(family: Family, dims: Mapping[str, Any], head_dim: int, mlp_ratio: float | None) -> dict[str, Any]:
    """`dims` at width heads x head_dim, the MLP keeping its ratio to the width."""
    width = dims["heads"] * head_dim
    out = {**dims, "width": width}
    if mlp_ratio is not None:
        out["mlp"] = max(1, round(mlp_ratio * width))
        if dims.get("act") == "glu":
            out["mlp"] += out["mlp"] % 2
    return out


def sweep(space: SearchSpace, regimes: Sequence[Regime] = REGIMES, head_dim: int | None = None) -> list[tuple[Regime, dict[str, Any]]]:
    """The configurations `condition_table` measures: `(regime, dims)`.

    "fixed-width": the space's own configurations. "fixed-head-dim": each of them rebuilt at width
    heads x `head_dim` (default: the space's largest head dimension, width // fewest heads, so the
    fewest heads keep the space's width), the MLP keeping its ratio to the width.
    """
    configs = space.configs()
    family = space.family
    out: list[tuple[Regime, dict[str, Any]]] = []
    if "fixed-width" in regimes:
        out += [("fixed-width", c.dims) for c in configs]
    if "fixed-head-dim" in regimes:
        widths = [resolved_width(family, c.dims) for c in configs]
        if head_dim is None:
            head_dim = max(w // c.dims["heads"] for w, c in zip(widths, configs))
        seen = set()
        for width, c in zip(widths, configs):
            mlp = c.dims.get("mlp")
            dims = _fixed_head_dim(family, c.dims, head_dim, mlp / width if mlp else None)
            key = tuple(sorted(dims.items()))
            if key not in seen:
                seen.add(key)
                out.append(("fixed-head-dim", dims))
    return out


def condition_table(
    space: SearchSpace,
    task: Task,
    seeds: Sequence[int] = (0, 1, 2),
    samples: int = 32,
    regimes: Sequence[Regime] = ("fixed-width",),
    head_dim: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """κ at initialisation for each configuration `sweep` gives, on `samples` eval inputs; `progress(done,
    total)` after each configuration (the command line's progress bar).

    One row per (regime, configuration): regime, key, layers, heads, width, head_dim, params;
    `kappa` (token-attention blocks: geometric mean over blocks and seeds), `kappa_first` /
    `kappa_last` (first / last token-attention block), `kappa_channel` / `kappa_inner` (channel and
    TNT-inner blocks, NaN where the model has none), `kappa_blocks` (every block: name, kind, κ over
    seeds) and `missing` (blocks whose hook never fired). The task must give the inputs the space's
    dims expect (ExplorerError otherwise, as a study would raise). Sorted so that reading down a
    group shows κ against heads at one width (fixed-width) or one head dimension (fixed-head-dim).
    """
    configs = space.configs()
    expected = configs[0].dims
    for key, value in task.dims().items():
        if key in expected and expected[key] != value:
            raise ExplorerError(
                f"task {task.name} gives {key}={value} but space {space.name} has {key}={expected[key]}", field="task"
            )
    family = space.family
    x = next(iter(task.load(samples, seed=0).eval))[0][:samples]
    rows: list[dict[str, Any]] = []
    swept = sweep(space, regimes, head_dim)
    for which, dims in swept:
        per_seed = []
        for seed in seeds:
            torch.manual_seed(seed)
            per_seed.append(attention_condition(family.build(dims), x))
        blocks = [_over_seeds(runs) for runs in zip(*per_seed)]
        token = [b for b in blocks if b["kind"] == "token" and b["kappa"] is not None]
        width = resolved_width(family, dims)
        rows.append(
            {
                "regime": which,
                "key": ",".join(f"{k}={dims[k]}" for k in space.free_dims),
                "layers": dims["layers"],
                "heads": dims["heads"],
                "width": width,
                "head_dim": width // dims["heads"],
                "params": family.params(dims),
                "kappa": _nan(summary(blocks)),
                "kappa_first": token[0]["kappa"] if token else math.nan,
                "kappa_last": token[-1]["kappa"] if token else math.nan,
                "kappa_channel": _nan(summary(blocks, "channel")),
                "kappa_inner": _nan(summary(blocks, "inner")),
                "kappa_blocks": blocks,
                "missing": [b["name"] for b in blocks if b["kappa"] is None],
            }
        )
        if progress is not None:
            progress(len(rows), len(swept))
    rows.sort(key=lambda r: (
        REGIMES.index(r["regime"]), r["width"] if r["regime"] == "fixed-width" else r["head_dim"], r["layers"], r["heads"]
    ))
    return pd.DataFrame(rows)


def _over_seeds(runs: Sequence[BlockKappa]) -> BlockKappa:
    """One block across seeds: geometric mean of its κ, None if any seed missed it."""
    kappas = [r["kappa"] for r in runs]
    value = None if any(k is None for k in kappas) else geometric_mean(kappas)  # type: ignore[arg-type]
    return BlockKappa(name=runs[0]["name"], kind=runs[0]["kind"], kappa=value)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
