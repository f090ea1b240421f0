"""A model family for fault tests, loaded by reference (`family: faulty:FaultyEncoder`) in this process
and in Ray's workers (their tests put this folder on the workers' PYTHONPATH).

The image encoder, except that its forward raises a fault once after a test `arm`s it: `illegal` a CUDA
illegal memory access (torch.AcceleratorError, as torch raises it), `oom` a CUDA out-of-memory error.
The fault comes at the first training forward of the second epoch (after epoch 1's checkpoint) of the
first trial to get there, whichever process runs it: the arming file in `$EXPLORER_TEST_FAULT_DIR` is
removed by the one that raises it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from explorer.families.image import ImageEncoderFamily

KINDS = ("illegal", "oom")


def arm(kind: str) -> None:
    (Path(os.environ["EXPLORER_TEST_FAULT_DIR"]) / f"arm-{kind}").touch()


def armed() -> list[str]:
    return [k for k in KINDS if (Path(os.environ["EXPLORER_TEST_FAULT_DIR"]) / f"arm-{k}").exists()]


class FaultyEncoder(ImageEncoderFamily):
    name = "faulty"

    def build(self, dims):
        model = super().build(dims)
        forward, calls = model.forward, []

        def faulty(x: torch.Tensor) -> torch.Tensor:
            calls.append(model.training)
            if model.training and calls.count(False) >= 2:  # evaluated before: κ at init and epoch 1
                kind = next((k for k in KINDS if _take(k)), None)
                if kind == "oom":
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                if kind == "illegal":
                    raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
            return forward(x)

        model.forward = faulty
        return model


def _take(kind: str) -> bool:
    folder = os.environ.get("EXPLORER_TEST_FAULT_DIR")
    if not folder:
        return False
    try:
        (Path(folder) / f"arm-{kind}").unlink()
    except FileNotFoundError:
        return False
    return True
