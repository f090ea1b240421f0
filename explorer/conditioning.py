"""Condition numbers of attention blocks on real inputs: κ(A) = σ₁(A) / σ_k(A).

Which matrix. Theorem 3.2 of Saratchandran, Teney and Lucey (arXiv 2505.20802) is about the
multi-head attention matrix A = [A_1, ..., A_h] in R^{N x D}: the per-head outputs
A_i = softmax(Q_i K_i^T / sqrt(d)) V_i in R^{N x D/h} of one input of N tokens, concatenated along
the feature axis, before the output projection. In explorer's families and in timm (Attention,
XCA, ChannelAttention, WindowAttention, TNT's Attention) that matrix is exactly the input of the
attention module's `proj` Linear, so a forward pre-hook on `proj` captures it, shape (..., N, D).
Leading dimensions index independent matrices: one per sample, or per sample and window (DaViT's
WindowAttention), or per sample and patch (TNT's inner attention).

Which k. The theorem takes D >> N and divides by σ_N, the smallest of the N singular values of the
wide matrix; it compares A with a Gaussian N x D matrix, whose κ ≈ (√D + √N) / (√D - √N). We use
k = min(N, D), the number of singular values A has, so that κ is σ_N where the theorem's setting
holds (N <= D: short sequences, patch grids) and stays the full-rank condition number when N > D
(long LM contexts). κ = inf means A is rank-deficient on that input.

Per block, κ is the (lower) median over the batch of the per-matrix values, computed in float64 on
the CPU: medians, because a few degenerate inputs (a blank digit) would dominate a mean of ratios.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from explorer.errors import ExplorerError
from explorer.families import get_family

if TYPE_CHECKING:
    from explorer.space import SearchSpace
    from explorer.tasks import Task

# Attention classes whose names lack "Attention": timm XCiT's cross-covariance attention.
_OTHER_ATTENTION_CLASSES = {"XCA"}


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(name, module)` of each attention module with a `proj` projection, in the model's order."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if ("Attention" in type(module).__name__ or type(module).__name__ in _OTHER_ATTENTION_CLASSES)
        and isinstance(getattr(module, "proj", None), nn.Module)  # a Linear, or GPT-2's Conv1D
    ]


def condition_number(a: torch.Tensor) -> float:
    """Median over the leading dims of σ₁/σ_k of the trailing (N, D) matrices, k = min(N, D)."""
    matrices = a.detach().to("cpu", torch.float64).reshape(-1, *a.shape[-2:])
    sigma = torch.linalg.svdvals(matrices)  # descending, min(N, D) values per matrix
    return float((sigma[:, 0] / sigma[:, -1]).median())


@torch.no_grad()
def attention_condition(model: nn.Module, batch_x: torch.Tensor) -> list[float]:
    """κ(A) of each attention module's multi-head output on `batch_x`, in the model's order.

    Runs one forward pass in eval mode (restoring the mode after) on the model's device.
    """
    modules = attention_modules(model)
    captured: list[torch.Tensor | None] = [None] * len(modules)

    def hook(index: int):
        def capture(_proj: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            if captured[index] is None:
                captured[index] = inputs[0]

        return capture

    handles = [module.proj.register_forward_pre_hook(hook(i)) for i, (_, module) in enumerate(modules)]
    was_training = model.training
    device = next(model.parameters()).device
    try:
        model.eval()
        model(batch_x.to(device))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [condition_number(a) for a in captured if a is not None]


def geometric_mean(values: Sequence[float]) -> float | None:
    """κ spans orders of magnitude, so its typical value is a mean of logs (of the finite ones; None if none)."""
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, finite)) / len(finite)) if finite else None


def condition_table(
    space: SearchSpace, task: Task, seeds: Sequence[int] = (0, 1, 2), samples: int = 32
) -> pd.DataFrame:
    """κ at initialisation for every feasible configuration of `space`, on `samples` eval inputs.

    One row per configuration: its key, layers, heads, width, head_dim, params; `kappa` (geometric
    mean over blocks and seeds), `kappa_first`/`kappa_last` (first/last block, geometric mean over
    seeds) and `kappa_blocks` (per block). The task must give the inputs the space's dims expect
    (ExplorerError otherwise, as a study would raise). Sorted by width, layers, heads, so that
    reading down a (width, layers) group shows κ against heads at fixed width.
    """
    configs = space.configs()
    expected = configs[0].dims if configs else {}
    for key, value in task.dims().items():
        if key in expected and expected[key] != value:
            raise ExplorerError(
                f"task {task.name} gives {key}={value} but space {space.name} has {key}={expected[key]}", field="task"
            )
    x = next(iter(task.load(samples, seed=0).eval))[0][:samples]
    rows: list[dict[str, Any]] = []
    for config in configs:
        dims = config.dims
        family = get_family(config.family)
        per_seed = []
        for seed in seeds:
            torch.manual_seed(seed)
            per_seed.append(attention_condition(family.build(dims), x))
        blocks = [geometric_mean(block) for block in zip(*per_seed)]
        rows.append(
            {
                "key": config.key,
                "layers": dims.get("layers"),
                "heads": dims.get("heads"),
                "width": dims.get("width"),
                "head_dim": dims["width"] // dims["heads"] if dims.get("width") and dims.get("heads") else None,
                "params": config.params,
                "kappa": geometric_mean([k for run in per_seed for k in run]),
                "kappa_first": blocks[0] if blocks else math.nan,
                "kappa_last": blocks[-1] if blocks else math.nan,
                "kappa_blocks": blocks,
            }
        )
    frame = pd.DataFrame(rows)
    return frame.sort_values(["width", "layers", "heads"], kind="stable", ignore_index=True) if rows else frame
