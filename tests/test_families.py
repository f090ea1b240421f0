"""Families: exact parameter counts (closed form vs built model), FLOPs, training, timm adapters."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import timm
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from explorer.families import _disk_cache, family_names, get_family, timm_adapters

OWN = ["image-encoder", "sequence-classifier", "causal-lm", "crammed-bert"]
TIMM = ["timm-vit", "timm-deit", "timm-xcit", "timm-tnt", "timm-davit"]
SPACES = Path(__file__).resolve().parents[1] / "spaces"


@st.composite
def own_dims(draw: st.DrawFn, family: str) -> dict:
    """Small random dims for one of explorer's own families (every field set, as spaces pass them)."""
    heads = draw(st.sampled_from([1, 2, 4]))
    act = draw(st.sampled_from(["gelu", "glu"]))
    dims = dict(
        layers=draw(st.integers(1, 3)),
        heads=heads,
        width=heads * draw(st.sampled_from([2, 4, 8])),
        mlp=draw(st.integers(1, 24)) * (2 if act == "glu" else 1),
        act=act,
        bias=draw(st.booleans()),
    )
    if family == "image-encoder":
        patch = draw(st.sampled_from([1, 2, 4]))
        dims |= dict(img_size=patch * draw(st.integers(1, 4)), patch=patch, in_chans=draw(st.integers(1, 3)))
    else:
        dims |= dict(vocab=draw(st.integers(2, 40)), seq_len=draw(st.integers(1, 12)))
    if family == "causal-lm":
        dims["tie_weights"] = draw(st.booleans())
    else:
        dims |= dict(num_classes=draw(st.integers(1, 5)), pool=draw(st.sampled_from(["cls", "mean"])))
    return {**get_family(family).defaults(), **dims}


def example_input(family: str, dims: dict, batch: int = 1, device: str = "cpu") -> torch.Tensor:
    if get_family(family).modality == "image":
        return torch.randn(batch, dims["in_chans"], dims["img_size"], dims["img_size"], device=device)
    return torch.randint(0, dims["vocab"], (batch, dims["seq_len"]), device=device)


def counted_flops(family: str, dims: dict) -> int:
    """FLOPs of a real forward, counted by torch on the meta device (no compute)."""
    with torch.device("meta"):
        model = get_family(family).build(dims)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(example_input(family, dims, device="meta"))
    return counter.get_total_flops()


@pytest.mark.parametrize("family", OWN)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_closed_form_equals_built_model(family: str, data: st.DataObject) -> None:
    fam = get_family(family)
    dims = data.draw(own_dims(family))
    model = fam.build(dims)
    assert fam.params(dims) == sum(p.numel() for p in model.parameters())
    assert len(model.blocks) == dims["layers"]
    flops = fam.flops(dims)
    assert flops == counted_flops(family, dims) > 0
    assert fam.flops({**dims, "layers": dims["layers"] + 1}) > flops


@pytest.mark.parametrize("family", OWN)
def test_own_families_lower_the_loss_on_a_fixed_batch(family: str) -> None:
    """A few optimizer steps on one fixed batch lower the loss: forward and backward are wired."""
    torch.manual_seed(0)
    fam = get_family(family)
    small = {"layers": 2, "heads": 2, "width": 16, "mlp": 32, "num_classes": 3, "vocab": 11, "seq_len": 8, "img_size": 8, "patch": 2}
    dims = {**fam.defaults(), **small}
    dims = {k: v for k, v in dims.items() if k in fam.Dims.model_fields}
    model = fam.build(dims)
    x = example_input(family, dims, batch=8)
    if fam.modality == "sequence":
        x[:, -2:] = 0  # padding
    y = torch.randint(0, dims.get("num_classes", dims.get("vocab")), x.shape if fam.modality == "lm" else (8,))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("tie_weights", [True, False])
def test_fresh_causal_lm_loss_is_near_uniform_guess(tie_weights: bool) -> None:
    """With the standard init a fresh LM's logits are near zero: cross-entropy on random bytes ~ ln(256)."""
    torch.manual_seed(0)
    dims = dict(layers=2, heads=4, width=128, mlp=512, vocab=256, seq_len=64, tie_weights=tie_weights)
    model = get_family("causal-lm").build(dims)
    ids = torch.randint(0, 256, (8, 65))  # random bytes: the next one is independent of the past
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert abs(loss.item() - math.log(256)) < 0.5


@pytest.mark.parametrize("family", OWN)
def test_own_families_use_standard_transformer_init(family: str) -> None:
    """Linear weights std 0.02, residual projections 0.02 / sqrt(2 layers), biases 0, LayerNorm 1/0."""
    torch.manual_seed(0)
    fam = get_family(family)
    layers = 8
    dims = {**fam.defaults(), "layers": layers, "heads": 4, "width": 128, "mlp": 256, "vocab": 64, "seq_len": 8, "bias": True}
    dims = {k: v for k, v in dims.items() if k in fam.Dims.model_fields}
    model = fam.build(dims)
    residual = {n for n, _ in model.named_modules() if n.endswith(("attn.proj", "mlp.fc2"))}
    assert len(residual) == 2 * layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            expected = 0.02 / math.sqrt(2 * layers) if name in residual else 0.02
            assert module.weight.std().item() == pytest.approx(expected, rel=0.1), name
            assert module.bias is None or not module.bias.any(), name
        elif isinstance(module, torch.nn.LayerNorm):
            assert (module.weight == 1).all() and (module.bias is None or not module.bias.any()), name
        elif isinstance(module, torch.nn.Embedding):
            assert module.weight.std().item() == pytest.approx(0.02, rel=0.1), name


def test_own_families_output_shape_per_modality() -> None:
    for family in OWN:
        fam = get_family(family)
        dims = {**fam.defaults(), "layers": 1, "heads": 2, "width": 8, "mlp": 16, "vocab": 9, "seq_len": 5}
        dims = {k: v for k, v in dims.items() if k in fam.Dims.model_fields}
        out = fam.build(dims)(example_input(family, dims, batch=2))
        expected = (2, dims["seq_len"], dims["vocab"]) if fam.modality == "lm" else (2, dims["num_classes"])
        assert tuple(out.shape) == expected, family


@pytest.mark.parametrize(
    ("layers", "heads", "millions"),
    [(16, 12, 119), (10, 24, 84)],  # the seed's Crammed BERT rows
)
def test_crammed_bert_counts_match_the_seeds_rows(layers: int, heads: int, millions: int) -> None:
    assert abs(get_family("crammed-bert").params({"layers": layers, "heads": heads}) / 1e6 - millions) < 1


@pytest.mark.parametrize("family", OWN + TIMM)
def test_heads_must_divide_width(family: str) -> None:
    fam = get_family(family)
    dims = {**fam.defaults(), "layers": 1, "heads": 5, "width": 64, "mlp": 64}
    for call in (fam.params, fam.build):
        with pytest.raises(ValueError, match="heads 5 must divide width 64"):
            call(dims)


@pytest.mark.parametrize("family", OWN + TIMM)
def test_unknown_dimension_is_an_error(family: str) -> None:
    fam = get_family(family)
    with pytest.raises(ValueError, match="depth"):
        fam.params({**fam.defaults(), "layers": 1, "heads": 1, "width": 64, "mlp": 64, "depth": 3})


def test_the_registry_names_the_module_of_every_family_it_registers() -> None:
    """`MODULES` (what the registry imports on a name's first use) lists every family explorer's own
    modules register, each by the module that registers it, so no family is found only by importing all."""
    import importlib
    import pkgutil

    import explorer.families as families

    registered = {}
    for mod in pkgutil.iter_modules(families.__path__):
        if not mod.name.startswith("_"):
            module = importlib.import_module(f"explorer.families.{mod.name}")
            registered |= {f.name: mod.name for f in vars(module).values()
                           if isinstance(f, type) and issubclass(f, families.Family) and f.__module__ == module.__name__
                           and "name" in vars(f)}
    assert registered == families.MODULES


def test_registry_knows_every_family_and_how_it_counts() -> None:
    assert set(OWN + TIMM) <= set(family_names())
    for name in OWN + TIMM:
        fam = get_family(name)
        assert fam.counting == ("meta-device (cached)" if name in TIMM else "closed-form")


SMALL_TIMM = {
    "timm-vit": dict(layers=2, heads=2, width=32, mlp=48, img_size=32, patch=8),
    "timm-deit": dict(layers=2, heads=4, width=32, img_size=32, patch=16),
    "timm-xcit": dict(layers=2, heads=4, width=32, mlp=64, img_size=32),
    "timm-tnt": dict(layers=2, heads=2, width=32, img_size=32),
    "timm-davit": dict(layers=2, heads=2, width=16, mlp=32, img_size=32, stage4_depth=2),
}


@pytest.mark.parametrize("family", TIMM)
def test_timm_meta_count_equals_real_build(family: str) -> None:
    fam = get_family(family)
    dims = {**fam.defaults(), **SMALL_TIMM[family], "num_classes": 5}
    model = fam.build(dims)
    assert fam.params(dims) == sum(p.numel() for p in model.parameters())
    assert tuple(model(torch.randn(2, 3, 32, 32)).shape) == (2, 5)
    # attention exposes an nn.Linear `proj` whose input is the concatenated heads (TNT: attn_out.proj)
    projs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.endswith("proj")]
    assert any(n.endswith(("attn.proj", "attn_out.proj")) for n in projs)


@pytest.mark.parametrize(
    ("family", "dims", "millions"),
    [
        # timm's own models at their default depth/heads (within 0.05M of the published counts)
        ("timm-xcit", dict(model="xcit_medium_24_p16_224", layers=24, heads=8), 84.4),
        ("timm-xcit", dict(model="xcit_large_24_p16_224", layers=24, heads=16), 189.1),
        ("timm-davit", dict(model="davit_base", layers=9, heads=4), 88.0),
        ("timm-davit", dict(model="davit_large", layers=9, heads=6), 196.8),
        ("timm-tnt", dict(model="tnt_b_patch16_224", layers=12, heads=10), 65.4),
        ("timm-vit", dict(model="vit_small_patch16_224", layers=12, heads=6), 22.1),
        ("timm-deit", dict(model="deit_small_patch16_224", layers=12, heads=6), 22.1),
        # the paper's reduced rows that a depth reproduces (heads barely or never move the count)
        ("timm-xcit", dict(model="xcit_medium_24_p16_224", layers=16, heads=16), 59.0),
        ("timm-xcit", dict(model="xcit_large_24_p16_224", layers=12, heads=32), 103.8),
        ("timm-davit", dict(model="davit_large", layers=5, heads=12), 140.0),
    ],
)
def test_timm_named_counts(family: str, dims: dict, millions: float) -> None:
    assert abs(get_family(family).params(dims) / 1e6 - millions) < 0.07


def test_timm_counts_are_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted once, a timm count is read back by a later process without building; a corrupt file is rewritten."""
    monkeypatch.delenv("EXPLORER_CACHE_DIR")  # the suite's own cache folder (conftest)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fam, dims = get_family("timm-vit"), {**SMALL_TIMM["timm-vit"], "num_classes": 5}
    params, flops = fam.params(dims), fam.flops(dims)
    path = _disk_cache.cache_file()
    assert path.parent == tmp_path / "explorer" and timm.__version__ in path.name
    assert sorted(json.loads(path.read_text()).values()) == sorted([params, flops])

    def no_build(*args, **kwargs):
        raise AssertionError("built a model although its count is on disk")

    monkeypatch.setattr(timm_adapters, "_COUNTS", _disk_cache.DiskCounts())  # a new process: empty memory
    monkeypatch.setattr(timm, "create_model", no_build)
    assert (fam.params(dims), fam.flops(dims)) == (params, flops)

    monkeypatch.undo()
    monkeypatch.delenv("EXPLORER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(timm_adapters, "_COUNTS", _disk_cache.DiskCounts())
    path.write_text('{"params vit_small_patch16_224": ')  # a write cut short
    assert fam.params(dims) == params
    assert list(json.loads(path.read_text()).values()) == [params]


def test_cache_folder_is_explorer_cache_dir_then_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPLORER_CACHE_DIR", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _disk_cache.cache_file().parent == tmp_path / "own"
    monkeypatch.delenv("EXPLORER_CACHE_DIR")
    assert _disk_cache.cache_file().parent == tmp_path / "xdg" / "explorer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _disk_cache.cache_file().parent == tmp_path / "home" / ".cache" / "explorer"


def test_timm_flops_match_published_macs() -> None:
    """ViT-S/16 at 224: 4.6 GMACs (timm's results tables), i.e. 9.2 GFLOPs, and more with depth."""
    fam = get_family("timm-vit")
    flops = fam.flops(dict(layers=12, heads=6))
    assert 9.1e9 < flops < 9.3e9
    assert fam.flops(dict(layers=13, heads=6)) > flops


SEED_SPACES = ["xcit-m", "xcit-l", "davit-b", "davit-l", "tnt-b", "vit-s", "crammed-bert"]
BASELINE_MILLIONS = {"xcit-m": 84.4, "xcit-l": 189.1, "davit-b": 88.0, "davit-l": 196.8, "tnt-b": 65.4, "vit-s": 22.1, "crammed-bert": 119.7}


@pytest.mark.parametrize("name", SEED_SPACES)
def test_seed_space_fixes_every_dimension_and_counts_its_baseline(name: str) -> None:
    spec = yaml.safe_load((SPACES / f"{name}.yaml").read_text())
    fam = get_family(spec["family"])
    assert set(spec["fixed"]) | set(spec["free"]) == set(fam.Dims.model_fields)
    assert spec["constraints"]["fixed_mlp"] is True
    params = fam.params({**spec["fixed"], **spec["baseline"]})
    assert abs(params / 1e6 - BASELINE_MILLIONS[name]) < 0.05
