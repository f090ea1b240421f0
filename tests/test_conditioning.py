"""κ(A) = σ₁/σ_k of the concatenated head outputs: which rows and blocks, kinds, regimes, means."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from explorer.cli import app
from explorer.conditioning import (
    attention_condition,
    attention_modules,
    condition_number,
    condition_table,
    geometric_mean,
    summary,
    sweep,
)
from explorer.errors import ExplorerError
from explorer.kappa import kappa_attrs, space_regime
from explorer.families import get_family
from explorer.space import load_space
from explorer.tasks import get_task

IMAGE = dict(layers=2, heads=4, width=64, mlp=128, img_size=8, patch=2, in_chans=1, num_classes=10)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def digits_batch() -> torch.Tensor:
    return next(iter(get_task("digits", {}).load(32, seed=0).eval))[0]


def test_condition_number_uses_all_min_n_d_singular_values():
    wide = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # N=2 < D=3: σ = (3, 1)
    assert condition_number(wide) == pytest.approx(3.0)
    assert condition_number(wide.T) == pytest.approx(3.0)  # N > D: k = D
    batch = torch.stack([torch.diag(torch.tensor([c, 1.0])) for c in (2.0, 3.0, 10.0)])
    assert condition_number(batch) == pytest.approx(3.0)  # median over the matrices


def test_rank_deficient_matrix_has_infinite_kappa():
    assert condition_number(torch.tensor([[1.0, 2.0], [2.0, 4.0]])) == math.inf
    assert condition_number(torch.zeros(3, 4)) == math.inf


def test_rows_keep_only_the_marked_rows_of_each_matrix():
    a = torch.stack([torch.diag(torch.tensor([5.0, 1.0, 1e-9])), torch.diag(torch.tensor([4.0, 2.0, 1e-9]))])
    rows = torch.tensor([[True, True, False], [True, True, False]])
    assert condition_number(a, rows) == pytest.approx(2.0)  # lower median of 5 and 2
    assert condition_number(a) > 1e8


def test_wide_gaussian_matrix_kappa_depends_on_n_and_d_only():
    """The Gaussian model: an N x D Gaussian A with D >> N has κ ≈ (√D + √N) / (√D - √N)."""
    n, d = 16, 4096
    a = torch.randn(8, n, d, generator=torch.Generator().manual_seed(0))
    expected = (math.sqrt(d) + math.sqrt(n)) / (math.sqrt(d) - math.sqrt(n))
    assert condition_number(a) == pytest.approx(expected, rel=0.05)


def test_one_kappa_per_block_and_the_model_is_left_as_it_was(digits_batch: torch.Tensor):
    torch.manual_seed(0)
    model = get_family("image-encoder").build(IMAGE).train()
    blocks = attention_condition(model, digits_batch)
    assert [(b["name"], b["kind"]) for b in blocks] == [("blocks.0.attn", "token"), ("blocks.1.attn", "token")]
    assert all(1 <= b["kappa"] < math.inf for b in blocks)
    assert model.training
    assert all(not m.proj._forward_pre_hooks for _, m in attention_modules(model))
    assert attention_condition(model, digits_batch) == blocks  # no state changed between calls


def test_captured_matrix_is_the_concatenated_head_output(digits_batch: torch.Tensor):
    """Recover proj's input from the attention module's output, independently of the hook."""
    torch.manual_seed(0)
    model = get_family("image-encoder").build(IMAGE).double().eval()  # float64: pinv stays exact
    outputs = []
    model.blocks[0].attn.register_forward_hook(lambda module, inputs, output: outputs.append(output))
    kappa = attention_condition(model, digits_batch.double())[0]["kappa"]
    proj = model.blocks[0].attn.proj
    heads_output = (outputs[0] - proj.bias) @ torch.linalg.pinv(proj.weight).T  # (B, N, width)
    assert heads_output.shape == (32, 17, 64)
    assert kappa == pytest.approx(condition_number(heads_output), rel=1e-2)


def kappa_at_init(family: str, dims: dict, x: torch.Tensor, seeds=(0, 1, 2)) -> float:
    blocks = []
    for seed in seeds:
        torch.manual_seed(seed)
        blocks += attention_condition(get_family(family).build(dims), x)
    return summary(blocks)


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
    """Measured on real inputs at width 64, heads 1..16 (a Gaussian A's κ would not move: D is fixed)."""
    data = get_task(task, options)
    x = next(iter(data.load(32, seed=0).eval))[0]
    dims = {**dims, **data.dims()}
    kappas = [kappa_at_init(family, {**dims, "heads": h}, x) for h in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(kappas, kappas[1:])), kappas


def test_each_head_output_is_near_rank_one_at_init(digits_batch: torch.Tensor):
    """Near-uniform attention at initialisation: every head's output is close to its mean row."""
    torch.manual_seed(0)
    model = get_family("image-encoder").build({**IMAGE, "layers": 1}).eval()
    captured = []
    model.blocks[0].attn.proj.register_forward_pre_hook(lambda module, inputs: captured.append(inputs[0]))
    model(digits_batch)
    heads = captured[0].double().unflatten(-1, (IMAGE["heads"], -1)).transpose(1, 2)  # (B, heads, N, head_dim)
    sigma = torch.linalg.svdvals(heads)
    assert (sigma[..., 1] / sigma[..., 0]).median() < 0.1


def test_padding_rows_do_not_change_kappa():
    """The same sequences padded further: κ is unchanged with padding rows left out, not with them kept."""
    task = get_task("listops", {"n_train": 8, "n_eval": 32, "min_length": 8, "max_length": 24})
    x = next(iter(task.load(32, seed=0).eval))[0]
    padded = torch.cat([x, torch.zeros(len(x), 40, dtype=x.dtype)], dim=1)
    torch.manual_seed(0)
    dims = dict(layers=2, heads=2, width=32, mlp=64, vocab=16, seq_len=64, num_classes=10)
    model = get_family("sequence-classifier").build(dims).double()  # float64: κ ~ 1e6 amplifies rounding
    short, long = attention_condition(model, x), attention_condition(model, padded)
    for a, b in zip(short, long):
        assert b["kappa"] == pytest.approx(a["kappa"], rel=1e-6)
    with_padding = attention_condition(model, padded, exclude_padding=False)
    assert all(w["kappa"] > 10 * b["kappa"] for w, b in zip(with_padding, long))


def test_a_block_whose_hook_never_fired_is_reported_missing_by_name(digits_batch: torch.Tensor):
    torch.manual_seed(0)
    model = get_family("image-encoder").build(IMAGE)
    model.blocks[0].forward = lambda x, key_mask=None: x  # block 0's attention never runs
    blocks = attention_condition(model, digits_batch)
    assert [b["name"] for b in blocks] == ["blocks.0.attn", "blocks.1.attn"]
    assert blocks[0]["kappa"] is None and blocks[1]["kappa"] >= 1
    assert summary(blocks) == pytest.approx(blocks[1]["kappa"])


def test_geometric_mean_keeps_infinite_kappa():
    assert geometric_mean([10.0, 1000.0]) == pytest.approx(100.0)
    assert geometric_mean([10.0, math.inf]) == math.inf
    assert geometric_mean([]) is None


TIMM_KINDS = {  # tiny models: the attention kind of each block, in the model's order
    "timm-xcit": (dict(model="xcit_nano_12_p8_224", layers=2, heads=2, width=32, mlp=64, patch=8), ["channel"] * 2),
    "timm-tnt": (dict(model="tnt_s_patch16_224", layers=2, heads=2, width=32, mlp=64, patch=16), ["inner", "token"] * 2),
    "timm-davit": (dict(model="davit_tiny", layers=1, heads=1, width=16, mlp=32), ["token", "channel"] * 4),
}


@pytest.mark.parametrize("family", sorted(TIMM_KINDS))
def test_timm_blocks_are_labelled_with_what_they_attend_over(family: str):
    dims, kinds = TIMM_KINDS[family]
    torch.manual_seed(0)
    model = get_family(family).build({**dims, "img_size": 32, "num_classes": 10})
    blocks = attention_condition(model, torch.randn(4, 3, 32, 32))
    assert [b["kind"] for b in blocks] == kinds
    assert all(b["kappa"] is not None for b in blocks)
    token = [b["kappa"] for b in blocks if b["kind"] == "token"]
    assert summary(blocks) == geometric_mean(token)  # None for XCiT: it has no token attention


def test_kappa_attrs_keep_every_block_with_its_kind_and_the_regime():
    init = [dict(name="a", kind="inner", kappa=1e9), dict(name="b", kind="token", kappa=10.0), dict(name="c", kind="token", kappa=None)]
    final = [dict(init[0], kappa=1e8), dict(init[1], kappa=1000.0), dict(init[2], kappa=math.inf)]
    attrs = kappa_attrs(init, final, "fixed-width")
    assert attrs["kappa_init"] == [1e9, 10.0, None] and attrs["kappa_blocks"] == ["a", "b", "c"]
    assert attrs["kappa_kinds"] == ["inner", "token", "token"] and attrs["kappa_regime"] == "fixed-width"
    assert attrs["kappa_init_mean"] == pytest.approx(10.0) and attrs["kappa_final_mean"] == math.inf


def write_space(tmp_path: Path, free: str, constraints: str = "{min_head_dim: 8}") -> Path:
    (tmp_path / "space.yaml").write_text(
        "name: tiny\nfamily: image-encoder\n"
        "fixed: {width: 32, mlp: 64, img_size: 8, patch: 2, in_chans: 1, num_classes: 10}\n"
        f"free: {free}\nconstraints: {constraints}\n"
    )
    return tmp_path / "space.yaml"


def test_space_regime_says_what_the_space_holds_fixed(tmp_path: Path):
    assert space_regime(load_space(write_space(tmp_path, "{layers: [1], heads: [1, 2, 4]}"))) == "fixed-width"
    varying = tmp_path / "varying.yaml"
    varying.write_text(
        "name: v\nfamily: image-encoder\nfixed: {mlp: 64, img_size: 8, patch: 2, in_chans: 1}\n"
        "free: {layers: [1], heads: [1, 2], width: [16, 32]}\n"
    )
    assert space_regime(load_space(varying)) == "varying"


def test_fixed_head_dim_sweep_scales_width_with_heads(tmp_path: Path):
    space = load_space(write_space(tmp_path, "{layers: [1, 2], heads: divisors}"))  # heads 1, 2, 4
    rows = sweep(space, ["fixed-head-dim"])
    assert [(d["layers"], d["heads"], d["width"], d["mlp"]) for _, d in rows] == [
        (n, h, 32 * h, 64 * h) for n in (1, 2) for h in (1, 2, 4)
    ]
    assert {d["width"] // d["heads"] for _, d in sweep(space, ["fixed-head-dim"], head_dim=8)} == {8}
    assert [r for r, _ in sweep(space)] == ["fixed-width"] * 6 + ["fixed-head-dim"] * 6


def test_condition_table_has_a_row_per_configuration_and_regime(tmp_path: Path):
    space = load_space(write_space(tmp_path, "{layers: [1, 2], heads: divisors}"))
    table = condition_table(space, get_task("digits", {}), seeds=(0, 1), regimes=("fixed-width", "fixed-head-dim"))
    fixed_width = table[table["regime"] == "fixed-width"]
    assert list(fixed_width["key"]) == [f"layers={n},heads={h}" for n in (1, 2) for h in (1, 2, 4)]
    assert list(fixed_width["head_dim"]) == [32, 16, 8] * 2 and set(fixed_width["width"]) == {32}
    fixed_head_dim = table[table["regime"] == "fixed-head-dim"]
    assert list(fixed_head_dim["width"]) == [32, 64, 128] * 2 and set(fixed_head_dim["head_dim"]) == {32}
    assert [len(blocks) for blocks in table["kappa_blocks"]] == [1, 1, 1, 2, 2, 2] * 2
    assert table["kappa_channel"].isna().all() and not table["missing"].map(len).any()
    for _, group in fixed_width.groupby("layers"):
        assert group["kappa"].is_monotonic_decreasing, group


def test_condition_table_refuses_a_task_that_does_not_fit_the_space(tmp_path: Path):
    write_space(tmp_path, "{layers: [1], heads: [1, 2]}")
    with pytest.raises(ExplorerError, match="img_size=16"):
        condition_table(load_space(tmp_path / "space.yaml"), get_task("digits", {"img_size": 16}))


def test_condition_command_sweeps_both_regimes(tmp_path: Path):
    space = write_space(tmp_path, "{layers: [1], heads: [1, 4]}")
    result = CliRunner().invoke(app, ["condition", str(space), "--seeds", "1", "--regime", "both", "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["regime"], r["heads"], r["width"]) for r in rows] == [
        ("fixed-width", 1, 32), ("fixed-width", 4, 32), ("fixed-head-dim", 1, 32), ("fixed-head-dim", 4, 128)
    ]
    assert all(r["kappa"] >= 1 for r in rows)
