"""κ(A) = σ₁/σ_k of the multi-head attention output, and Theorem 3.2's trend at initialisation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from explorer.conditioning import (
    attention_condition,
    attention_modules,
    condition_number,
    condition_table,
    geometric_mean,
)
from explorer.errors import ExplorerError
from explorer.families import get_family
from explorer.space import load_space
from explorer.tasks import get_task

IMAGE = dict(layers=2, heads=4, width=64, mlp=128, img_size=8, patch=2, in_chans=1, num_classes=10)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits_batch() -> torch.Tensor:
    return next(iter(get_task("digits", {}).load(32, seed=0).eval))[0]


def test_condition_number_uses_all_min_n_d_singular_values():
    wide = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # N=2 < D=3: σ = (3, 1)
    assert condition_number(wide) == pytest.approx(3.0)
    assert condition_number(wide.T) == pytest.approx(3.0)  # N > D: k = D
    batch = torch.stack([torch.diag(torch.tensor([c, 1.0])) for c in (2.0, 3.0, 10.0)])
    assert condition_number(batch) == pytest.approx(3.0)  # median over the matrices


def test_wide_gaussian_matrix_matches_the_theorem():
    """Theorem 3.2's setting: an N x D Gaussian A with D >> N has κ ≈ (√D + √N) / (√D - √N)."""
    n, d = 16, 4096
    a = torch.randn(8, n, d, generator=torch.Generator().manual_seed(0))
    expected = (math.sqrt(d) + math.sqrt(n)) / (math.sqrt(d) - math.sqrt(n))
    assert condition_number(a) == pytest.approx(expected, rel=0.05)


def test_one_kappa_per_block_and_the_model_is_left_as_it_was(digits_batch: torch.Tensor):
    torch.manual_seed(0)
    model = get_family("image-encoder").build(IMAGE).train()
    kappas = attention_condition(model, digits_batch)
    assert len(kappas) == IMAGE["layers"] and all(1 <= k < math.inf for k in kappas)
    assert model.training
    assert all(not m.proj._forward_pre_hooks for _, m in attention_modules(model))
    assert attention_condition(model, digits_batch) == kappas  # no state changed between calls


def test_captured_matrix_is_the_concatenated_head_output(digits_batch: torch.Tensor):
    """Recover proj's input from the attention module's output, independently of the hook."""
    torch.manual_seed(0)
    model = get_family("image-encoder").build(IMAGE).double().eval()  # float64: pinv stays exact
    outputs = []
    model.blocks[0].attn.register_forward_hook(lambda module, inputs, output: outputs.append(output))
    kappa = attention_condition(model, digits_batch.double())[0]
    proj = model.blocks[0].attn.proj
    heads_output = (outputs[0] - proj.bias) @ torch.linalg.pinv(proj.weight).T  # (B, N, width)
    assert heads_output.shape == (32, 17, 64)
    assert kappa == pytest.approx(condition_number(heads_output), rel=1e-2)


def kappa_at_init(family: str, dims: dict, x: torch.Tensor, seeds=(0, 1, 2)) -> float:
    kappas = []
    for seed in seeds:
        torch.manual_seed(seed)
        kappas += attention_condition(get_family(family).build(dims), x)
    return geometric_mean(kappas)


LISTOPS = {"n_train": 64, "n_eval": 64}
VIT = dict(model="vit_small_patch16_224", layers=2, heads=1, width=64, mlp=128, patch=4, img_size=16, in_chans=3)


@pytest.mark.parametrize(
    "family, dims, task, options",
    [
        ("image-encoder", IMAGE, "digits", {}),
        ("timm-vit", {**VIT, "num_classes": 10}, "digits", {"img_size": 16, "in_chans": 3}),
        ("sequence-classifier", dict(layers=2, heads=1, width=64, mlp=128), "listops", LISTOPS),
    ],
)
def test_kappa_at_init_falls_as_heads_rise_at_fixed_width(family: str, dims: dict, task: str, options: dict):
    """Theorem 3.2's trend on real inputs: width 64 fixed, heads 1..16 (measured on digits: 1e7 -> 1e3)."""
    data = get_task(task, options)
    x = next(iter(data.load(32, seed=0).eval))[0]
    dims = {**dims, **data.dims()}
    kappas = [kappa_at_init(family, {**dims, "heads": h}, x) for h in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(kappas, kappas[1:])), kappas


def test_condition_table_has_a_row_per_configuration(tmp_path: Path):
    (tmp_path / "space.yaml").write_text(
        "name: tiny\nfamily: image-encoder\n"
        "fixed: {width: 32, mlp: 64, img_size: 8, patch: 2, in_chans: 1, num_classes: 10}\n"
        "free: {layers: [1, 2], heads: divisors}\nconstraints: {min_head_dim: 8}\n"
    )
    space = load_space(tmp_path / "space.yaml")
    table = condition_table(space, get_task("digits", {}), seeds=(0, 1))
    assert list(table["key"]) == [f"layers={n},heads={h}" for n in (1, 2) for h in (1, 2, 4)]
    assert list(table["head_dim"]) == [32, 16, 8] * 2
    assert [len(blocks) for blocks in table["kappa_blocks"]] == [1, 1, 1, 2, 2, 2]
    assert {"params", "kappa", "kappa_first", "kappa_last", "width"} <= set(table.columns)
    for _, group in table.groupby("layers"):
        assert group["kappa"].is_monotonic_decreasing, group


def test_condition_table_refuses_a_task_that_does_not_fit_the_space(tmp_path: Path):
    (tmp_path / "space.yaml").write_text(
        "name: tiny\nfamily: image-encoder\nfixed: {width: 32, mlp: 64, img_size: 8, patch: 2, in_chans: 1}\n"
        "free: {layers: [1], heads: [1, 2]}\n"
    )
    with pytest.raises(ExplorerError, match="img_size=16"):
        condition_table(load_space(tmp_path / "space.yaml"), get_task("digits", {"img_size": 16}))
