"""Tasks: each loads real data with the shapes its dims promise, deterministically, and bad input names itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from explorer.errors import ExplorerError
from explorer.tasks import Task, get_task, task_names
from explorer.tasks.listops import VOCAB, ListOpsOptions, _generate, generate_tree, tokens, value

SRC = "studies/x.yaml"
TINY_LISTOPS = {"n_train": 200, "n_eval": 50, "max_depth": 3, "max_args": 5, "min_length": 4, "max_length": 48}


def make_images(root: Path, classes: tuple[str, ...] = ("cat", "dog", "eel"), n: int = 5, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def make_text(path: Path, repeats: int = 60) -> Path:
    path.write_text("Once upon a time, a small fox found a shiny stone near the river. " * repeats)
    return path


@pytest.fixture(
    params=["digits", "digits-32-rgb", "listops", "image-folder", "image-folder-grey", "text-byte", "text-char"]
)
def task(request: pytest.FixtureRequest, tmp_path: Path) -> Task:
    kind = request.param
    if kind == "digits":
        return get_task("digits", {}, SRC)
    if kind == "digits-32-rgb":
        return get_task("digits", {"img_size": 32, "in_chans": 3}, SRC)
    if kind == "listops":
        return get_task("listops", TINY_LISTOPS, SRC)
    if kind.startswith("image-folder"):
        chans = 1 if kind.endswith("grey") else 3
        return get_task("image-folder", {"root": str(make_images(tmp_path)), "img_size": 16, "in_chans": chans}, SRC)
    level = kind.removeprefix("text-")
    return get_task("text-file", {"path": str(make_text(tmp_path / "t.txt")), "seq_len": 16, "level": level}, SRC)


def test_registry_lists_every_task() -> None:
    assert task_names() == ["digits", "image-folder", "listops", "text-classification", "text-file"]


def test_batches_match_dims(task: Task) -> None:
    dims = task.dims()
    data = task.load(batch_size=8, seed=0)
    for loader in (data.train, data.eval):
        x, y = next(iter(loader))
        assert len(x) == len(y) <= 8
        assert sum(len(b[1]) for b in loader) == len(loader.dataset)
        if task.modality == "image":
            assert x.dtype == torch.float32 and y.dtype == torch.long
            assert x.shape[1:] == (dims["in_chans"], dims["img_size"], dims["img_size"])
            assert y.shape == (len(x),) and 0 <= y.min() and y.max() < dims["num_classes"]
        elif task.modality == "sequence":
            assert x.dtype == y.dtype == torch.long
            assert x.shape[1:] == (dims["seq_len"],) and y.shape == (len(x),)
            assert 0 <= x.min() and x.max() < dims["vocab"] and y.max() < dims["num_classes"]
        else:
            assert x.dtype == y.dtype == torch.long
            assert x.shape == y.shape and x.shape[1:] == (dims["seq_len"],)
            assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
            assert 0 <= x.min() and x.max() < dims["vocab"]
    assert task.metric == ("eval_loss" if task.modality == "lm" else "accuracy")
    assert task.higher_is_better == (task.metric == "accuracy")


def test_same_seed_same_batches_other_seed_other_order(task: Task) -> None:
    def first_batches(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = task.load(batch_size=4, seed=seed)
        return next(iter(data.train))[1], next(iter(data.eval))[1]

    train_a, eval_a = first_batches(0)
    train_b, eval_b = first_batches(0)
    train_c, eval_c = first_batches(1)
    assert torch.equal(train_a, train_b) and torch.equal(eval_a, eval_b)
    assert torch.equal(eval_a, eval_c)  # the eval split and order do not depend on the training seed
    data_a, data_c = task.load(4, 0), task.load(4, 1)
    assert [b[1].tolist() for b in data_a.train] != [b[1].tolist() for b in data_c.train]


def test_epochs_reshuffle_and_resume_reproduces_them() -> None:
    loader = get_task("digits", {}, SRC).load(batch_size=64, seed=3).train
    epoch0 = torch.cat([y for _, y in loader])
    epoch1 = torch.cat([y for _, y in loader])
    assert not torch.equal(epoch0, epoch1) and torch.equal(epoch0.sort().values, epoch1.sort().values)
    resumed = get_task("digits", {}, SRC).load(batch_size=64, seed=3).train
    resumed.set_epoch(1)
    assert torch.equal(torch.cat([y for _, y in resumed]), epoch1)


def test_digits_split_is_stratified_normalised_and_fixed_by_split_seed() -> None:
    data = get_task("digits", {}, SRC).load(batch_size=2000, seed=0)
    (x_train, y_train), (x_eval, y_eval) = next(iter(data.train)), next(iter(data.eval))
    assert (len(y_train), len(y_eval)) == (1437, 360)
    assert torch.bincount(y_eval, minlength=10).min() >= 35  # about 36 per class
    assert abs(x_train.mean()) < 1e-4 and abs(x_train.std() - 1) < 1e-3
    other = get_task("digits", {"split_seed": 1}, SRC).load(batch_size=2000, seed=0)
    assert not torch.equal(next(iter(other.eval))[0], x_eval)


def test_listops_labels_agree_with_an_independent_evaluator() -> None:
    def evaluate(ids: list[int]) -> int:  # a stack machine over the token ids, written apart from `value`
        stack: list[list] = []
        result = None
        for tok in (VOCAB[i] for i in ids if i):
            if tok.startswith("["):
                stack.append([tok])
                continue
            if tok == "]":
                op, *args = stack.pop()
                result = {"[MIN": min(args), "[MAX": max(args), "[SM": sum(args) % 10,
                          "[MED": int(np.median(args))}[op]  # fmt: skip
            else:
                result = int(tok)
            if stack:
                stack[-1].append(result)
        return result

    opts = ListOpsOptions(**TINY_LISTOPS)
    x, y = _generate(opts)
    assert len(y) == 250 and len({tuple(r) for r in x.tolist()}) == 250  # distinct, as in LRA
    lengths = (x > 0).sum(1)
    assert lengths.min() > opts.min_length and lengths.max() < opts.max_length
    assert [evaluate(row) for row in x.tolist()] == y.tolist()
    assert torch.bincount(y, minlength=10).min() > 0


def test_listops_tree_helpers_follow_lra() -> None:
    tree = (((((("[MED", 1), 2), 3), 4), "]"))
    assert tokens(tree) == ["[MED", "1", "2", "3", "4", "]"] and value(tree) == 2  # int(median 2.5)
    nested = ((("[SM", 9), ((("[MAX", 3), 7), "]")), "]")
    assert value(nested) == 6
    import random

    tree, length = generate_tree(random.Random(5), 1, 4, 6)
    assert len(tokens(tree)) == length


def test_listops_seed_changes_the_data() -> None:
    a = _generate(ListOpsOptions(**TINY_LISTOPS))[0]
    b = _generate(ListOpsOptions(**{**TINY_LISTOPS, "seed": 1}))[0]
    assert not torch.equal(a, b)


def test_image_folder_uses_train_and_val_folders(tmp_path: Path) -> None:
    make_images(tmp_path / "train", n=4)
    make_images(tmp_path / "val", n=2, seed=1)
    data = get_task("image-folder", {"root": str(tmp_path), "img_size": 8}, SRC).load(4, 0)
    assert (len(data.train.dataset), len(data.eval.dataset)) == (12, 6)


def test_text_file_char_vocab_counts_train_chars_plus_unknown(tmp_path: Path) -> None:
    path = make_text(tmp_path / "t.txt")
    text = path.read_text()
    train_chars = set(text[: int(len(text) * 0.9)])
    assert get_task("text-file", {"path": str(path), "level": "char"}).dims()["vocab"] == len(train_chars) + 1


# --- input errors: one line naming the file and the field --------------------------------------------------


def expect_error(match: str, fn, *args) -> str:
    with pytest.raises(ExplorerError, match=match) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_task_and_bad_options_name_the_field(tmp_path: Path) -> None:
    expect_error(r"^studies/x\.yaml: task\.name: unknown task 'mnist'", get_task, "mnist", {}, SRC)
    expect_error(r"^studies/x\.yaml: task\.img_size: Input should be a valid integer", get_task, "digits", {"img_size": "big"}, SRC)
    expect_error(r"^studies/x\.yaml: task\.colour: unknown field", get_task, "digits", {"colour": 1}, SRC)
    expect_error(r"^studies/x\.yaml: task\.level: ", get_task, "text-file", {"path": "t", "level": "word"}, SRC)
    expect_error(r"^studies/x\.yaml: task: .*min_length", get_task, "listops", {"min_length": 60, "max_length": 61}, SRC)


def test_listops_unreachable_lengths_fail_with_a_reason() -> None:
    task = get_task("listops", {"n_train": 2, "n_eval": 1, "max_depth": 2, "max_args": 2, "min_length": 10,
                                "max_length": 20}, SRC)  # fmt: skip
    expect_error(r"^studies/x\.yaml: task: only 0 of 3 distinct", task.load, 4, 0)


def test_image_folder_errors_name_the_root(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    expect_error(rf"^studies/x\.yaml: task\.root: directory not found: {missing}", get_task, "image-folder",
                 {"root": str(missing)}, SRC)  # fmt: skip
    empty = get_task("image-folder", {"root": str(tmp_path)}, SRC)
    expect_error(r"^studies/x\.yaml: task\.root: no class folders in", empty.dims)
    expect_error(r"^studies/x\.yaml: task\.root: no class folders in", empty.load, 4, 0)
    make_images(tmp_path / "a", classes=("x",), n=3)
    (tmp_path / "a" / "y").mkdir()
    expect_error(r"^studies/x\.yaml: task\.root: .*no valid file for the classes y", get_task("image-folder",
                 {"root": str(tmp_path / "a")}, SRC).load, 4, 0)  # fmt: skip


def test_image_folder_unreadable_image_is_named(tmp_path: Path) -> None:
    root = make_images(tmp_path, classes=("x", "y"), n=2)
    (root / "y" / "bad.png").write_bytes(b"not a png")
    data = get_task("image-folder", {"root": str(root), "img_size": 8, "eval_fraction": 0.5}, SRC).load(16, 0)
    message = expect_error(r"^studies/x\.yaml: task\.root: cannot read image", lambda: [b for b in (*data.train, *data.eval)])
    assert "bad.png" in message


def test_text_file_errors_name_the_file(tmp_path: Path) -> None:
    def task(path: Path, **options):
        return get_task("text-file", {"path": str(path), **options}, SRC)

    expect_error(rf"^studies/x\.yaml: task\.path: file not found: {tmp_path / 'no.txt'}", task, tmp_path / "no.txt")
    (tmp_path / "empty.txt").write_text("")
    expect_error(r"^studies/x\.yaml: task\.path: empty file: .*empty\.txt", task, tmp_path / "empty.txt")
    short = make_text(tmp_path / "short.txt", repeats=2)
    expect_error(r"^studies/x\.yaml: task\.path: .*short\.txt is too short: .* seq_len \+ 1 = 129",
                 task(short).load, 8, 0)  # fmt: skip
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"ok \xff\xfe" * 100)
    expect_error(r"^studies/x\.yaml: task\.path: .*bin\.txt is not UTF-8", task(binary, level="char").dims)
    assert task(binary, level="byte", seq_len=16).dims() == {"vocab": 256, "seq_len": 16}
