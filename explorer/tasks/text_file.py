"""Byte- or character-level language modelling on the user's text file (e.g. TinyStories).

The file's first `1 - eval_fraction` of tokens train and the rest evaluate, so no eval text is
seen in training. Samples are windows of `seq_len + 1` tokens: x the first `seq_len`, y the same
shifted by one. Byte level has a vocabulary of 256; character level has the sorted characters of
the train part plus id 0 for a character met only in the eval part. Tokens stay in a compact
dtype in memory and become int64 one batch at a time, so a file of gigabytes stays affordable.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from explorer.tasks import Task, register

if TYPE_CHECKING:
    import torch

    from explorer.tasks import TaskData

UNKNOWN = 0  # character-level id of a character absent from the train part


class TextFileOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path = Field(description="the text file")
    seq_len: int = Field(128, ge=1, description="tokens the model sees per sample")
    level: Literal["byte", "char"] = Field("byte", description="`byte` (vocabulary 256, any file) or `char` (the train "
                                                               "part's characters, plus one id for unseen ones; UTF-8 only)")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="the file's last share, evaluation only (never trained on)")
    stride: int | None = Field(None, ge=1, description="tokens between the starts of training windows (smaller than "
                                                       "`seq_len`: overlapping windows); null: `seq_len`")


class Windows:
    """Windows of a token stream; `windows[index]` returns a whole batch with one gather where the tokens live."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, stride: int):
        import torch

        self.tokens, self.seq_len, self.stride = tokens, seq_len, stride
        self.offsets = torch.arange(seq_len + 1, device=tokens.device)

    def __len__(self) -> int:
        return (len(self.tokens) - self.seq_len - 1) // self.stride + 1

    def __getitem__(self, index: int | list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        starts = torch.as_tensor(index, device=self.tokens.device) * self.stride
        window = self.tokens[starts[..., None] + self.offsets].long()
        return window[..., :-1], window[..., 1:]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to(self, device: str | torch.device) -> Windows:
        """The tokens in their compact dtype on `device` (a batch becomes int64 as it is gathered)."""
        return Windows(self.tokens.to(device), self.seq_len, self.stride)

    def same(self, other: object) -> bool:
        from explorer.device_data import same_tensor

        return (isinstance(other, Windows) and (other.seq_len, other.stride) == (self.seq_len, self.stride)
                and same_tensor(self.tokens, other.tokens))


@lru_cache(maxsize=2)
def _read(path: Path, level: str, eval_fraction: float, stamp: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(train tokens, eval tokens, vocab); `stamp` (mtime, size) refreshes the cache when the file changes.

    Raises UnicodeDecodeError for a character-level file that is not UTF-8.
    """
    import torch

    if level == "byte":
        tokens = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
        cut = int(len(tokens) * (1 - eval_fraction))
        return tokens[:cut], tokens[cut:], 256
    points = np.frombuffer(path.read_text(encoding="utf-8").encode("utf-32-le"), dtype=np.uint32)
    cut = int(len(points) * (1 - eval_fraction))
    chars = np.unique(points[:cut])
    pos = np.minimum(np.searchsorted(chars, points), len(chars) - 1)
    ids = np.where(chars[pos] == points, pos + 1, UNKNOWN).astype(np.int32)
    tokens = torch.from_numpy(ids)
    return tokens[:cut], tokens[cut:], len(chars) + 1


@register
class TextFile(Task):
    name = "text-file"
    modality = "lm"
    metric = "eval_loss"
    higher_is_better = False
    Options = TextFileOptions

    def __init__(self, options: TextFileOptions, source: str | None = None):
        super().__init__(options, source)
        if not options.path.is_file():
            raise self.error(f"file not found: {options.path}", "path")
        if options.path.stat().st_size == 0:
            raise self.error(f"empty file: {options.path}", "path")

    def _tokens(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        o = self.options
        stat = o.path.stat()
        try:
            train, held, vocab = _read(o.path, o.level, o.eval_fraction, (stat.st_mtime_ns, stat.st_size))
        except UnicodeDecodeError as err:
            raise self.error(f"{o.path} is not UTF-8 text (byte {err.start}); use level: byte", "path") from None
        need = o.seq_len + 1
        if len(train) < need or len(held) < need:
            raise self.error(
                f"{o.path} is too short: {len(train)} train and {len(held)} eval {o.level}s, "
                f"each needs at least seq_len + 1 = {need}",
                "path",
            )
        return train, held, vocab

    def dims(self) -> dict[str, int]:
        vocab = 256 if self.options.level == "byte" else self._tokens()[2]
        return {"vocab": vocab, "seq_len": self.options.seq_len}

    def load(self, batch_size: int, seed: int) -> TaskData:
        from explorer.tasks import TaskData, batch_loader

        o = self.options
        train, held, _ = self._tokens()
        return TaskData(
            train=batch_loader(Windows(train, o.seq_len, o.stride or o.seq_len), batch_size, shuffle=True, seed=seed),
            eval=batch_loader(Windows(held, o.seq_len, o.seq_len), batch_size, shuffle=False),
        )
