"""scikit-learn's 8x8 handwritten digits as images: the default task, needing no download.

1797 grey images of 10 classes, held in memory as tensors. The split is stratified and fixed by
`split_seed` alone, so trials with different training seeds are judged on the same eval images.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from explorer.tasks import Task, register

if TYPE_CHECKING:
    import torch

    from explorer.tasks import TaskData


class DigitsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    img_size: int = Field(8, ge=1, description="side in pixels; other sizes are resized (bilinear), e.g. 32 or 224 for timm models")
    in_chans: int = Field(1, ge=1, description="channels; the grey channel is repeated, e.g. 3 for timm models")
    eval_fraction: float = Field(0.2, gt=0, lt=1, description="share held out for evaluation, stratified by class")
    split_seed: int = Field(0, description="fixes the split, whatever the training seed")


@lru_cache(maxsize=4)
def _tensors(img_size: int, in_chans: int, eval_fraction: float, split_seed: int) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_eval, y_eval), normalised with the train split's mean and std."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1)  # (N, 1, 8, 8), values 0..16
    y = torch.tensor(data.target, dtype=torch.long)
    train_idx, eval_idx = train_test_split(
        range(len(y)), test_size=eval_fraction, stratify=data.target, random_state=split_seed
    )
    if img_size != x.shape[-1]:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False, antialias=True)
    x = x.expand(-1, in_chans, -1, -1)
    x_train, x_eval = x[train_idx], x[eval_idx]
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, y[train_idx], (x_eval - mean) / std, y[eval_idx]


@register
class Digits(Task):
    name = "digits"
    modality = "image"
    metric = "accuracy"
    higher_is_better = True
    Options = DigitsOptions

    def dims(self) -> dict[str, int]:
        return {"img_size": self.options.img_size, "in_chans": self.options.in_chans, "num_classes": 10}

    def load(self, batch_size: int, seed: int) -> TaskData:
        from explorer.tasks import tensor_data

        o = self.options
        x_train, y_train, x_eval, y_eval = _tensors(o.img_size, o.in_chans, o.eval_fraction, o.split_seed)
        return tensor_data((x_train, y_train), (x_eval, y_eval), batch_size, seed)
