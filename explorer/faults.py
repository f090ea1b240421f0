"""What went wrong in a trial: the configuration (a measurement of it failing) or the machine (a fault).

A trial that fails by itself (a NaN loss, an error in its model, running past its time limit, running
out of device memory while it had the device to itself) is a result: the configuration cannot be
trained here, and the study records that once. A fault says nothing about the configuration: the
CUDA context broke (an illegal memory access, a device-side assert, an ECC error), a worker was lost,
or the device ran out of memory while other trials shared it. A fault is retried on a fresh worker
(a new process: a broken CUDA context cannot be used again), an out-of-memory one alone on its device,
and is never stored as a measurement.
"""

from __future__ import annotations

import re
import sys

from explorer.errors import TrialFailed

# what torch says when the device (not the model) failed: the process's CUDA context is unusable after it
_BROKEN = re.compile(r"CUDA error|illegal memory access|device-side assert|unspecified launch failure|"
                     r"uncorrectable ECC|CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR)|cuDNN error|NCCL error")


class Fault(Exception):
    """A transient fault: retried on a fresh worker (`alone`: with its device to itself), never a measurement.

    `broken`: the process's CUDA context is unusable, so no later trial may run in this process.
    """

    def __init__(self, reason: str, *, alone: bool = False, broken: bool = False):
        super().__init__(reason)
        self.alone = alone
        self.broken = broken


class OutOfMemory(TrialFailed):
    """The device ran out of memory. Alone on the device this is the configuration's result (it cannot run
    here, with the memory it needed); with neighbours on the device it is a `Fault` (see `classify`)."""


def classify(err: BaseException, *, shared: bool) -> BaseException:
    """`err` raised inside a trial as what it means: a `Fault` to retry, else a `TrialFailed` to store.

    `shared`: other trials used the trial's device while it ran (fractional GPUs, threads on one GPU),
    so running out of memory may be their doing: rerun alone before it counts.
    """
    if isinstance(err, Fault):
        return err
    if isinstance(err, OutOfMemory):
        if shared:
            return Fault(f"{err} (other trials shared the device: rerun alone)", alone=True)
        return err
    if isinstance(err, TrialFailed):
        return err
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    torch = sys.modules.get("torch")  # an AcceleratorError comes from a torch already imported (none: none was raised)
    if (torch is not None and isinstance(err, torch.AcceleratorError)) or (isinstance(err, RuntimeError) and _BROKEN.search(first)):
        return Fault(f"{type(err).__name__}: {first}", broken=True)
    return TrialFailed(f"{type(err).__name__}: {first}")
