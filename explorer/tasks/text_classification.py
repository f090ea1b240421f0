"""Text classification from the user's CSV or TSV file (e.g. GLUE's SST-2 `train.tsv`), byte level.

One example per row, under a header that names the text and label columns (`text` and `label`
options; `.tsv` files are tab-separated and unquoted, as GLUE's are, anything else is CSV). Each text
becomes its UTF-8 bytes as ids 1-256 (0 is padding), cut or right-padded to `seq_len`. Classes are
the sorted distinct labels of the train rows. Evaluation is `eval_path` (a second file, e.g. GLUE's
`dev.tsv`, relative to `path`'s folder) or else `eval_fraction` of the rows drawn by `split_seed`, never by the training seed, so
every trial of a study evaluates on the same rows.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.tasks import Task, register

if TYPE_CHECKING:
    import torch

    from explorer.tasks import TaskData

PAD = 0
VOCAB = 257  # padding + 256 byte values


class TextClassificationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path = Field(description="the file: `.tsv` is tab-separated and unquoted (GLUE's layout), anything else CSV")
    text: str = Field("text", description="the header's name of the text column")
    label: str = Field("label", description="the header's name of the label column")
    seq_len: int = Field(128, ge=1, description="bytes per text, cut or padded")
    eval_path: Path | None = Field(None, description="a second file to evaluate on (e.g. `dev.tsv`), relative to "
                                                     "`path`'s folder; null: split `path`")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of the rows held out, when there is no `eval_path`")
    split_seed: int = Field(0, description="fixes that split, whatever the training seed")


def encode(texts: list[str], seq_len: int) -> torch.Tensor:
    """(N, seq_len) int64 ids: UTF-8 bytes + 1, cut at seq_len, padded with 0."""
    import torch

    ids = np.zeros((len(texts), seq_len), dtype=np.int64)
    for i, text in enumerate(texts):
        raw = np.frombuffer(text.encode("utf-8")[:seq_len], dtype=np.uint8)
        ids[i, : len(raw)] = raw.astype(np.int64) + 1
    return torch.from_numpy(ids)


@lru_cache(maxsize=4)
def _read(path: Path, stamp: tuple[int, int]) -> pd.DataFrame:
    """The file as strings; `stamp` (mtime, size) refreshes the cache when the file changes."""
    tsv = path.suffix.lower() == ".tsv"
    return pd.read_csv(path, sep="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
                       dtype=str, keep_default_na=False)


@register
class TextClassification(Task):
    name = "text-classification"
    modality = "sequence"
    metric = "accuracy"
    higher_is_better = True
    Options = TextClassificationOptions

    def _frame(self, field: str) -> pd.DataFrame:
        path: Path = getattr(self.options, field)
        if field == "eval_path" and not path.is_absolute():
            path = self.options.path.parent / path
        if not path.is_file():
            raise self.error(f"file not found: {path}", field)
        try:
            frame = _read(path, (path.stat().st_mtime_ns, path.stat().st_size))
        except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as err:
            raise self.error(f"cannot read {path} as {'TSV' if path.suffix.lower() == '.tsv' else 'CSV'}: "
                             f"{str(err).strip().splitlines()[0]}", field) from None
        for column in (self.options.text, self.options.label):
            if column not in frame.columns:
                which = "text" if column == self.options.text else "label"
                raise self.error(f"{path} has no column {column!r}; its header has {', '.join(map(str, frame.columns))}", which)
        if frame.empty:
            raise self.error(f"{path} has no rows", field)
        return frame

    def _split(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        frame = self._frame("path")
        if self.options.eval_path is not None:
            return frame, self._frame("eval_path")
        order = np.random.default_rng(self.options.split_seed).permutation(len(frame))
        n_eval = max(1, int(len(frame) * self.options.eval_fraction))
        if n_eval >= len(frame):
            raise self.error(f"{self.options.path} has {len(frame)} rows: too few to hold out {self.options.eval_fraction:.0%}", "path")
        return frame.iloc[order[n_eval:]], frame.iloc[order[:n_eval]]

    def _classes(self, train: pd.DataFrame) -> list[str]:
        classes = sorted(set(train[self.options.label]))
        if len(classes) < 2:
            raise self.error(f"{self.options.path} has one label, {classes[0]!r}; classification needs two or more", "label")
        return classes

    def dims(self) -> dict[str, int]:
        return {"vocab": VOCAB, "seq_len": self.options.seq_len, "num_classes": len(self._classes(self._split()[0]))}

    def load(self, batch_size: int, seed: int) -> TaskData:
        import torch

        from explorer.tasks import tensor_data

        train, held = self._split()
        index = {label: i for i, label in enumerate(self._classes(train))}
        unknown = sorted(set(held[self.options.label]) - set(index))
        if unknown:
            raise self.error(f"eval rows have labels the train rows lack: {', '.join(map(repr, unknown[:3]))}", "label")

        def tensors(rows: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
            labels = torch.tensor([index[v] for v in rows[self.options.label]], dtype=torch.long)
            return encode(list(rows[self.options.text]), self.options.seq_len), labels

        return tensor_data(tensors(train), tensors(held), batch_size, seed)
