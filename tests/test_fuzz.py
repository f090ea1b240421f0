"""Hostile input: random and malformed YAML is accepted and valid, or rejected with one line.

Three kinds of documents go to `load_space` and `load_study_spec`: random text, random nested
data, and random mutations of the shipped spaces/ and studies/ files. Anything but a valid result
or an `ExplorerError` whose message is one line (another exception, a traceback) fails the test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explorer.errors import ExplorerError
from explorer.space import load_space
from explorer.study import load_study_spec

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted((ROOT / "spaces").glob("*.yaml"))
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
# FUZZ_EXAMPLES=1000 searches deeper locally; CI runs the default
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(["divisors", "digits", "grid", "nsga2", "400k", "1e6", "-3", "maximize accuracy"]))
keys = st.sampled_from(["name", "family", "fixed", "free", "constraints", "baseline", "layers", "heads", "width", "mlp",
                        "min", "max", "step", "space", "task", "budget", "sampler", "n_trials", "storage", "objectives",
                        "param_budget", "min_head_dim", "epochs", "seed", "two\nlines", "a: b"]) | st.text(max_size=8)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5), max_leaves=25)
mappings = st.dictionaries(keys, documents, max_size=8)


def check(load: Callable[[Path], Any], path: Path, valid: Callable[[Any], None]) -> None:
    """`load(path)` either returns something `valid` accepts or raises a one-line ExplorerError naming
    the file at fault (the document, or the space file a study names)."""
    try:
        loaded = load(path)
    except ExplorerError as err:
        assert "\n" not in str(err) and str(err).startswith((str(path), str(path.parents[1] / "spaces"))), repr(str(err))
        assert not any(noise in str(err) for noise in PYDANTIC_NOISE), repr(str(err))
        return
    valid(loaded)


PYDANTIC_NOISE = ("[type=", "input_value=", "errors.pydantic.dev", "Value error, ", "Extra inputs are not permitted")


def valid_space(space) -> None:
    configs = space.configs()
    assert configs and all(isinstance(c.params, int) and c.params > 0 for c in configs)
    assert len({c.key for c in configs}) == len(configs)
    assert space.baseline is None or space.baseline in configs


def valid_study(study) -> None:
    valid_space(study.space)
    assert study.keys and study.spec.n_trials >= 1 and study.objectives


def mutate(doc: Any, data: st.DataObject, top: bool = True) -> Any:
    """One random edit somewhere in a document: drop, replace, retype, or add a key, or empty a list."""
    if isinstance(doc, dict) and doc and (top or data.draw(st.booleans())):
        key = data.draw(st.sampled_from(sorted(doc, key=str)))
        action = data.draw(st.sampled_from(["drop", "replace", "recurse", "add"]))
        out = dict(doc)
        if action == "drop":
            del out[key]
        elif action == "replace":
            out[key] = data.draw(documents)
        elif action == "add":
            out[data.draw(keys)] = data.draw(documents)
        else:
            out[key] = mutate(doc[key], data, top=False)
        return out
    if isinstance(doc, list) and doc:
        i = data.draw(st.integers(0, len(doc) - 1))
        return [*doc[:i], mutate(doc[i], data, top=False), *doc[i + 1:]] if data.draw(st.booleans()) else []
    return data.draw(documents)


@contextmanager
def workdir(base: Path) -> Iterator[Path]:
    """A copy of the spaces/ and studies/ layout (studies name spaces as ../spaces/X.yaml) inside
    pytest's `base`, one per example, removed afterwards even when the example fails."""
    with tempfile.TemporaryDirectory(dir=base) as name:
        tmp = Path(name)
        shutil.copytree(ROOT / "spaces", tmp / "spaces")
        (tmp / "studies").mkdir()
        yield tmp


@FUZZ
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_random_text(tmp_path: Path, text: str) -> None:
    with workdir(tmp_path) as tmp:
        for name, load, valid in (("spaces/x.yaml", load_space, valid_space), ("studies/x.yaml", load_study_spec, valid_study)):
            path = tmp / name
            path.write_text(text, errors="surrogateescape")
            check(load, path, valid)


@FUZZ
@given(doc=mappings | documents)
def test_random_documents(tmp_path: Path, doc: Any) -> None:
    with workdir(tmp_path) as tmp:
        for name, load, valid in (("spaces/x.yaml", load_space, valid_space), ("studies/x.yaml", load_study_spec, valid_study)):
            path = tmp / name
            path.write_text(yaml.safe_dump(doc))
            check(load, path, valid)


@pytest.mark.parametrize("folder, sources, load, valid", [
    # the timm spaces count parameters on the meta device: ~0.5 s an example
    pytest.param("spaces", SPACES, load_space, valid_space, marks=pytest.mark.slow, id="spaces"),
    pytest.param("studies", STUDIES, load_study_spec, valid_study, id="studies"),
])
@FUZZ
@given(data=st.data())
def test_mutated_shipped_files(folder: str, sources: list[Path], load: Callable, valid: Callable, data: st.DataObject, tmp_path: Path) -> None:
    with workdir(tmp_path) as tmp:
        source = data.draw(st.sampled_from(sources))
        path = tmp / folder / source.name
        path.write_text(yaml.safe_dump(mutate(yaml.safe_load(source.read_text()), data)))
        check(load, path, valid)


VIT = yaml.safe_load((ROOT / "spaces" / "vit-digits.yaml").read_text())
BOMB = "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i else 'x'] * 10)}]\n" for i in range(9))


@pytest.mark.parametrize("text, words", [
    (yaml.safe_dump({**VIT, "two\nlines": 1}), "two\\nlines: unknown field"),
    (yaml.safe_dump({**VIT, "free": {"lay\ners": [1], "heads": "divisors"}}), "free.lay\\ners"),
    (yaml.safe_dump({**VIT, "free": {"layers": {"min": 1, "max": 10**8}, "heads": "divisors"}}), "100,000,000 combinations"),
    (yaml.safe_dump({**VIT, "free": {"layers": {"min": 1, "max": 60_000}, "heads": [1, 2, 4, 8]}}), "240,000 combinations"),
    (yaml.safe_dump({**VIT, "fixed": {k: v for k, v in VIT["fixed"].items() if k != "width"},
                     "free": {"layers": [1], "width": [64, "x"], "heads": "divisors"}}), "needs a positive integer width"),
    (yaml.safe_dump({**VIT, "fixed": {**VIT["fixed"], "width": 10**12}}), "no feasible configuration"),
    ("name: " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    (BOMB + "name: x\n", "more than 100,000 values"),
    ("name: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
], ids=["newline-key", "newline-dim", "huge-range", "huge-range-heads-list", "text-width", "huge-width", "deep", "alias-bomb", "python-tag"])
def test_hostile_spaces_are_one_line_errors(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ExplorerError) as info:
        load_space(path)
    assert "\n" not in str(info.value) and words in str(info.value), str(info.value)


STUDY = yaml.safe_load((ROOT / "studies" / "digits-vit-trade.yaml").read_text())


@pytest.mark.parametrize("folder, doc, words", [
    ("spaces", {**{k: v for k, v in VIT.items() if k != "name"}, "nmae": "x"}, "nmae: unknown field (did you mean name?)"),
    ("spaces", {**VIT, "constraints": {**VIT["constraints"], "min_head_dims": 8}}, "constraints.min_head_dims: unknown field (did you mean min_head_dim?)"),
    ("studies", {**{k: v for k, v in STUDY.items() if k != "n_trials"}, "n_trails": 24}, "n_trails: unknown field (did you mean n_trials?)"),
    ("studies", {**STUDY, "budget": {**STUDY["budget"], "epoch": 3}}, "budget.epoch: unknown field (did you mean epochs?)"),
    ("studies", {**STUDY, "executor": {"name": "local", "cpus": 1}}, "executor.cpus: unknown field (did you mean cpu?)"),
    ("studies", {**STUDY, "task": {"name": "digits", "img_sise": 8}}, "task.img_sise: unknown field (did you mean img_size?)"),
    ("studies", {**STUDY, "colour": 1}, "colour: unknown field (known: name, space, task, budget, replicates, decision, objectives"),
], ids=["space-top", "space-nested", "study-missing-field", "study-budget", "study-executor", "study-task", "study-no-match"])
def test_unknown_key_is_named_first_with_its_close_match(tmp_path: Path, folder: str, doc: dict, words: str) -> None:
    with workdir(tmp_path) as tmp:
        path = tmp / folder / "x.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        with pytest.raises(ExplorerError) as info:
            (load_space if folder == "spaces" else load_study_spec)(path)
        assert str(info.value).startswith(f"{path}: {words}"), str(info.value)
