"""The text-classification task on generated CSV/TSV files: splits, encoding, training, one-line errors."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from explorer.errors import ExplorerError
from explorer.tasks import get_task
from explorer.tasks.text_classification import encode
from explorer.train import Budget, run_trial

SRC = "studies/x.yaml"


def reviews(path: Path, rows: int = 300, sep: str = "\t", seed: int = 0) -> Path:
    """A sentiment-like file: the label is whether the review says 'good' or 'bad'; labels sorted in the file."""
    rng = random.Random(seed)
    things, fillers = ["film", "plot", "cast", "song"], ["the", "a", "very", "really", "quite"]
    lines = []
    for i in range(rows):
        word = "good" if i < rows // 2 else "bad"
        text = " ".join([rng.choice(fillers), rng.choice(things), "was", rng.choice(fillers), word])
        lines.append(f"{text}{sep}{'positive' if word == 'good' else 'negative'}")
    path.write_text(f"sentence{sep}label\n" + "\n".join(lines) + "\n")
    return path


def task(path: Path, **options):
    return get_task("text-classification", {"path": str(path), "text": "sentence", "seq_len": 24, **options}, SRC)


def test_dims_split_and_batches(tmp_path: Path) -> None:
    t = task(reviews(tmp_path / "r.tsv"))
    assert t.dims() == {"vocab": 257, "seq_len": 24, "num_classes": 2}
    data = t.load(batch_size=500, seed=0)
    (x_train, y_train), (x_eval, y_eval) = next(iter(data.train)), next(iter(data.eval))
    assert len(x_train) == len(y_train) == 270 and len(x_eval) == 30 and x_train.shape[1] == 24
    assert set(y_eval.tolist()) == {0, 1}  # a seeded shuffle, not the file's sorted tail
    same = task(tmp_path / "r.tsv").load(batch_size=500, seed=5)
    assert torch.equal(next(iter(same.eval))[0], x_eval)  # the eval rows do not move with the training seed


def test_encoding_is_bytes_plus_one_padded_with_zero() -> None:
    ids = encode(["ab", "é"], 3)
    assert ids.tolist() == [[98, 99, 0], [0xC3 + 1, 0xA9 + 1, 0]]


def test_csv_with_quotes_and_a_separate_eval_file(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text('text,label\n"good, really",1\n"bad, sadly",0\n"good",1\n')
    (tmp_path / "dev.csv").write_text('text,label\n"good",1\n')
    t = get_task("text-classification", {"path": str(tmp_path / "train.csv"), "eval_path": "dev.csv", "seq_len": 8}, SRC)
    data = t.load(batch_size=8, seed=0)
    x, y = next(iter(data.train))
    assert len(x) == 3 and bytes(int(v) - 1 for v in x[0] if v).decode() in {"good, re", "bad, sad", "good"}
    assert next(iter(data.eval))[1].tolist() == [1]


def test_sequence_classifier_learns_the_file(tmp_path: Path) -> None:
    t = task(reviews(tmp_path / "r.tsv"))
    dims = dict(layers=1, heads=2, width=32, mlp=64, **t.dims())
    result = run_trial("sequence-classifier", dims, t, Budget(epochs=6, batch_size=32, lr=3e-3), device="cpu")
    assert result.metric > 0.9 and len(result.kappa_init) == 1


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"path": "missing.tsv"}, "task.path: file not found"),
        ({"text": "review"}, "task.text: .* has no column 'review'; its header has sentence, label"),
        ({"eval_path": "nope.tsv"}, "task.eval_path: file not found"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, options: dict, words: str) -> None:
    path = reviews(tmp_path / "r.tsv")
    opts = {"path": str(path), "text": "sentence", **options}
    if not opts["path"].startswith("/"):
        opts["path"] = str(tmp_path / opts["path"])
    with pytest.raises(ExplorerError, match=rf"^{SRC}: {words}"):
        get_task("text-classification", opts, SRC).dims()


def test_one_label_is_refused(tmp_path: Path) -> None:
    (tmp_path / "one.csv").write_text("text,label\n" + "x,1\n" * 20)
    with pytest.raises(ExplorerError, match="task.label: .* has one label, '1'; classification needs two or more"):
        get_task("text-classification", {"path": str(tmp_path / "one.csv")}, SRC).dims()
