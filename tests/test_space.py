"""Search spaces: loading, enumeration, constraints, and one-line errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from explorer.errors import ExplorerError
from explorer.space import load_space

SPACES = sorted(Path(__file__).parents[1].joinpath("spaces").glob("*.yaml"))

BASE = {
    "name": "t",
    "family": "image-encoder",
    "fixed": {"width": 32, "mlp": 64, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
    "free": {"layers": {"min": 1, "max": 3}, "heads": "divisors"},
    "constraints": {"min_head_dim": 8},
}


def write(tmp_path: Path, doc: dict | str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def with_(**changes) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_shipped_spaces_load_and_count(path: Path) -> None:
    space = load_space(path)
    configs = space.configs()
    assert configs and all(c.params > 0 for c in configs)
    assert len({c.key for c in configs}) == len(configs)
    if space.baseline is not None:
        assert space.baseline.key in {c.key for c in configs}


def test_enumeration_is_stable_and_filtered(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, BASE))
    keys = [c.key for c in space.configs()]
    assert keys == [f"layers={l},heads={h}" for l in (1, 2, 3) for h in (1, 2, 4)]  # head dim >= 8 of width 32
    assert keys == [c.key for c in load_space(write(tmp_path, BASE)).configs()]
    assert len({c.dims["mlp"] for c in space.configs()}) == 1


def test_params_depend_on_depth_not_heads(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, BASE))
    by = {(c["layers"], c["heads"]): c.params for c in space.configs()}
    assert by[(2, 1)] == by[(2, 4)] and by[(3, 1)] > by[(2, 1)]


def test_explain_names_each_constraint(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, with_(constraints__param_budget=[None, "20k"])))
    dims = {**space.configs()[0].dims}
    assert space.explain(dims) == []
    assert "does not divide" in space.explain({**dims, "heads": 3})[0]
    assert "min_head_dim" in space.explain({**dims, "heads": 8})[0]
    assert "budget high" in space.explain({**dims, "layers": 9})[0]
    assert "fixes mlp" in space.explain({**dims, "mlp": 99})[0]


@pytest.mark.parametrize(
    "doc, field, words",
    [
        (with_(colour="red"), "colour", "unknown field"),
        (with_(free__layers={"min": 3, "max": 1}), "free", "layers: max (1) is below min (3)"),
        (with_(free__layers="many"), "free", "layers: expected a list"),
        (with_(free__layers={"min": 1, "max": 3, "stride": 1}), "free", "layers.stride: unknown field (did you mean step?)"),
        (with_(nmae="t"), "nmae", "unknown field (did you mean name?)"),
        (with_(constraints__heads_divide_width=False), "constraints.heads_divide_width", "every family needs heads to divide the width"),
        (with_(fixed__width=0), "fixed.width", "greater than or equal to 1"),
        (with_(free__heads=[3, 5]), "free", "heads_divide_width"),
        (with_(free__heads=[1, 2], constraints__min_head_dim=64), "free", "min_head_dim"),
        (with_(constraints__param_budget=[10, 20]), "free", "e.g. layers=1,heads=1: 9,674 parameters > budget high 20"),
        (with_(constraints__param_budget=[10]), "constraints.param_budget", "[lo, hi]"),
        (with_(constraints__min_head_dim=0), "constraints.min_head_dim", ""),
        (with_(free__mlp=[64, 128]), "free.mlp", "fixed_mlp"),
        (with_(fixed__depth=3), "fixed.depth", "no dimension"),
        (with_(family="resnet"), "family", "unknown family"),
        (with_(fixed__width="wide"), "fixed.width", "valid integer"),
        (with_(free__layers=[]), "free", "layers: empty list"),
        (with_(baseline={"layers": 9, "heads": 1}), "baseline", "infeasible"),
        (with_(baseline={"depth": 1}), "baseline", "not a free dimension"),
        (with_(free__layers={"min": 1, "max": 2}, free__width="divisors"), "free", "only for heads"),
        (with_(name=None), "name", "required"),
    ],
)
def test_bad_space_is_one_line_naming_file_and_field(tmp_path: Path, doc: dict, field: str, words: str) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(ExplorerError) as info:
        load_space(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}"), message
    assert words in message, message
    assert not any(noise in message for noise in ("[type=", "input_value", "Value error", "Extra inputs")), message


@pytest.mark.parametrize("text", ["- a\n- b\n", "a: [1, 2\n", "!!python/object/apply:os.system ['true']\n", ""])
def test_malformed_yaml_is_one_line(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ExplorerError) as info:
        load_space(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ExplorerError, match="file not found"):
        load_space(tmp_path / "nope.yaml")


TIMM = {"name": "t", "family": "timm-vit", "fixed": {"width": 192, "mlp": 768, "img_size": 32, "patch": 16},
        "free": {"layers": [1, 2], "heads": [3, 6]}}


@pytest.mark.parametrize("model, words", [
    ("resnet50", "model 'resnet50' is not a vit_* model, the ones whose depth and heads this family varies"),
    ("deit_tiny_patch16_224", "set family: timm-deit"),
    ("vit_smal_patch16_224", "model 'vit_smal_patch16_224' is not a timm model; did you mean vit_small_patch16_224"),
    ("no_such_net", "is not a timm model; see timm.list_models('vit_*')"),
])
def test_timm_space_with_a_wrong_model_names_the_model_field(tmp_path: Path, model: str, words: str) -> None:
    path = write(tmp_path, {**TIMM, "fixed": {**TIMM["fixed"], "model": model}})
    with pytest.raises(ExplorerError) as info:
        load_space(path)
    assert str(info.value).startswith(f"{path}: fixed.model: "), str(info.value)
    assert words in str(info.value) and "no feasible" not in str(info.value)


def test_heads_given_as_a_list_count_toward_the_candidate_limit(tmp_path: Path) -> None:
    path = write(tmp_path, with_(free__layers={"min": 1, "max": 60_000}, free__heads=[1, 2, 4, 8]))
    with pytest.raises(ExplorerError, match=r"free: 240,000 combinations of free values; at most 100,000"):
        load_space(path)


def test_heads_divisors_of_free_widths_count_toward_the_candidate_limit(tmp_path: Path) -> None:
    doc = with_(free__layers={"min": 1, "max": 2000}, free__width=[720, 840], fixed__width=None)  # 30 and 32 divisors
    with pytest.raises(ExplorerError, match=r"free: 124,000 combinations"):
        load_space(write(tmp_path, doc))
