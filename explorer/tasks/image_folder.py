"""The user's own images in ImageFolder layout (one folder per class), e.g. CIFAR-10 or an ImageNet subset.

`root/train` and `root/val` are used as the split when both exist; otherwise `root` holds the class
folders and a stratified `eval_fraction` of each class, fixed by `split_seed`, is held out. Images
are read lazily (the folder may not fit in memory), resized to `img_size` and normalised with the
ImageNet statistics timm's models expect.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from explorer.errors import ExplorerError
from explorer.tasks import Task, register

if TYPE_CHECKING:
    from PIL import Image
    from torch.utils.data import Dataset
    from torchvision.datasets import ImageFolder as TorchImageFolder

    from explorer.tasks import TaskData

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageFolderOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    root: Path = Field(description="folder of class folders, or with `train/` and `val/` inside, which are then the split")
    img_size: int = Field(32, ge=1, description="images are resized to `img_size` x `img_size` and normalised with "
                                                "ImageNet's statistics")
    in_chans: Literal[1, 3] = Field(3, description="3 (RGB) or 1 (grey)")
    eval_fraction: float = Field(0.2, gt=0, lt=1, description="share of each class held out, when there is no "
                                                              "`train/` and `val/`")
    split_seed: int = Field(0, description="fixes that split")
    workers: int = Field(0, ge=0, description="DataLoader processes decoding images")


def _open_image(path: str, source: str | None) -> Image.Image:
    """torchvision's loader, with an unreadable image reported by name instead of a PIL traceback."""
    from PIL import Image  # here: PIL costs a fifth of a second, which tasks without images never need

    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except OSError as err:
        raise ExplorerError(f"cannot read image {path}: {err}", source=source, field="task.root") from None


def stratified_split(targets: list[int], eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) indices: each class with at least two images gives round(fraction * n), at least one, to eval."""
    by_class: dict[int, list[int]] = {}
    for i, t in enumerate(targets):
        by_class.setdefault(t, []).append(i)
    rng = random.Random(seed)
    train, held = [], []
    for idx in by_class.values():
        rng.shuffle(idx)
        k = max(1, round(eval_fraction * len(idx))) if len(idx) > 1 else 0
        held += idx[:k]
        train += idx[k:]
    return sorted(train), sorted(held)


@register
class ImageFolder(Task):
    name = "image-folder"
    modality = "image"
    metric = "accuracy"
    higher_is_better = True
    Options = ImageFolderOptions

    def __init__(self, options: ImageFolderOptions, source: str | None = None):
        super().__init__(options, source)
        if not options.root.is_dir():
            raise self.error(f"directory not found: {options.root}", "root")

    def _dirs(self) -> tuple[Path, Path | None]:
        root = self.options.root
        if (root / "train").is_dir() and (root / "val").is_dir():
            return root / "train", root / "val"
        return root, None

    def _classes(self, directory: Path) -> list[str]:
        classes = sorted(e.name for e in directory.iterdir() if e.is_dir())
        if not classes:
            raise self.error(f"no class folders in {directory} (expected ImageFolder layout: one folder per class)", "root")
        return classes

    def dims(self) -> dict[str, int]:
        o = self.options
        return {"img_size": o.img_size, "in_chans": o.in_chans, "num_classes": len(self._classes(self._dirs()[0]))}

    def _dataset(self, directory: Path) -> "TorchImageFolder":
        from torchvision import transforms  # imported here: torchvision costs seconds, other tasks never need it
        from torchvision.datasets import ImageFolder as TorchImageFolder

        o = self.options
        steps = [transforms.Resize((o.img_size, o.img_size))]
        mean, std = IMAGENET_MEAN, IMAGENET_STD
        if o.in_chans == 1:
            steps.append(transforms.Grayscale(1))
            mean, std = (sum(mean) / 3,), (sum(std) / 3,)
        steps += [transforms.ToTensor(), transforms.Normalize(mean, std)]
        self._classes(directory)
        try:
            return TorchImageFolder(
                str(directory), transform=transforms.Compose(steps), loader=partial(_open_image, source=self.source)
            )
        except FileNotFoundError as err:  # a class folder without images
            raise self.error(f"{directory}: {err}".strip(), "root") from None

    def load(self, batch_size: int, seed: int) -> TaskData:
        import torch
        from torch.utils.data import DataLoader, Subset

        from explorer.tasks import EpochBatches, TaskData

        o = self.options
        train_dir, val_dir = self._dirs()
        train_set = self._dataset(train_dir)
        if val_dir is not None:
            eval_set: Dataset = self._dataset(val_dir)
            if eval_set.classes != train_set.classes:  # type: ignore[attr-defined]
                raise self.error(f"class folders of {train_dir} and {val_dir} differ", "root")
        else:
            train_idx, eval_idx = stratified_split(train_set.targets, o.eval_fraction, o.split_seed)
            if not eval_idx:
                raise self.error(f"too few images in {train_dir} to hold out an eval split", "root")
            train_set, eval_set = Subset(train_set, train_idx), Subset(train_set, eval_idx)  # type: ignore[assignment]

        def loader(ds: Dataset, shuffle: bool) -> DataLoader:
            batches = EpochBatches(len(ds), batch_size, shuffle, seed)  # type: ignore[arg-type]
            return DataLoader(
                ds,
                batch_sampler=batches,
                num_workers=o.workers,
                persistent_workers=o.workers > 0,
                generator=torch.Generator().manual_seed(seed),  # leaves torch's global RNG to the model
            )

        return TaskData(train=loader(train_set, True), eval=loader(eval_set, False))
