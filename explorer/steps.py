"""The optimizer step of a trial, kept on the device: how a step runs (eagerly, compiled, as a CUDA graph)
and the numerical settings it runs under (bf16 autocast, TF32).

A step of a small model is a few hundred short kernels; launching them from Python costs more than
running them. So a step never waits for the host: its loss is summed and its first non-finite loss
remembered in device tensors (`Tally`), read once per epoch or every NAN_CHECK_EVERY steps on CUDA.
`budget.compile` picks how the step runs:

- `none`: eagerly, as PyTorch runs it.
- `compile`: the model's forward through `torch.compile` (Inductor). Each configuration compiles
  anew (seconds to a minute), so it pays only for long trials.
- `cudagraphs`: the whole step (forward, backward, clipping, AdamW) captured as one CUDA graph and
  replayed: one launch a step, nothing compiled. The ragged last batch of an epoch gets a second
  graph, so every sample is still seen every epoch exactly as without graphs (dropping it would
  change the data a trial trains on; padding it would change its mean loss and any batch norm).
  The learning rate lives in a device tensor the scheduler fills between replays (AdamW with
  `capturable=True`). On the CPU there is no graph: the step runs eagerly and the trial records `none`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from explorer.budget import Compile

StepFn = Callable[..., None]
WARMUP_STEPS = 3  # eager steps on a side stream before a capture, as torch.cuda.graphs asks


def compile_used(mode: Compile, device: str) -> Compile:
    """What `mode` becomes on `device`: CUDA graphs need CUDA."""
    return "none" if mode == "cudagraphs" and not device.startswith("cuda") else mode


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA, both set explicitly (torch's defaults differ:
    off for matmuls, on for cuDNN convolutions). Process-wide: every trial of a study sets the same."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def autocast(device: str, bf16: bool, graphs: bool = False) -> Callable[[], contextlib.AbstractContextManager]:
    """bf16 autocast on CUDA (no weight cache inside a CUDA graph, as torch.cuda.graphs requires); fp32 elsewhere."""
    if bf16 and device.startswith("cuda"):
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not graphs)
    return contextlib.nullcontext


def adamw(params: Iterable[tuple[torch.nn.Parameter, bool]], lr: float, weight_decay: float, device: str,
          graphs: bool = False) -> torch.optim.AdamW:
    """AdamW, decaying the parameters flagged True (matrices, as nanoGPT and timm do; not biases, norms).

    Fused on CUDA; for a CUDA graph also `capturable`, with the learning rate in a device tensor.
    """
    params = list(params)
    groups = [{"params": [p for p, decay in params if decay], "weight_decay": weight_decay},
              {"params": [p for p, decay in params if not decay], "weight_decay": 0.0}]
    cuda = device.startswith("cuda")
    rate = torch.tensor(lr, device=device) if graphs else lr
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=rate, fused=cuda, capturable=graphs and cuda)


@dataclass
class Tally:
    """What the steps of an epoch leave on the device: the summed loss, the step count, and the first
    non-finite loss (its step number, -1 while none) — per seed when `shape` is (seeds,)."""

    loss_sum: torch.Tensor
    step: torch.Tensor
    first_bad: torch.Tensor
    bad_loss: torch.Tensor

    @classmethod
    def on(cls, device: str, shape: Sequence[int] = ()) -> Tally:
        return cls(torch.zeros(shape, device=device), torch.zeros((), dtype=torch.long, device=device),
                   torch.full(shape, -1, dtype=torch.long, device=device), torch.zeros(shape, device=device))

    def start(self, step: int) -> None:
        """A new epoch after `step` steps: in place, so a captured graph keeps writing here."""
        self.loss_sum.zero_()
        self.step.fill_(step)
        self.first_bad.fill_(-1)
        self.bad_loss.zero_()

    def add(self, loss: torch.Tensor) -> None:
        """Count one step's (detached) loss: a handful of kernels, no host sync."""
        self.step += 1
        self.loss_sum += loss
        newly_bad = (self.first_bad < 0) & ~torch.isfinite(loss)
        self.first_bad.copy_(torch.where(newly_bad, self.step, self.first_bad))
        self.bad_loss.copy_(torch.where(newly_bad, loss, self.bad_loss))

    def tensors(self) -> list[torch.Tensor]:
        return [self.loss_sum, self.step, self.first_bad, self.bad_loss]


def model_step(model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
               grad_clip: float | None, cast: Callable[[], contextlib.AbstractContextManager], tally: Tally) -> StepFn:
    """One training step of `model` on a batch (x, y): cross-entropy over every target (each token of an
    LM), gradients clipped to `grad_clip`, AdamW; `forward` is the model or its compiled twin."""

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with cast():
            logits = forward(x)
        loss = F.cross_entropy(logits.float().flatten(0, -2), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        tally.add(loss.detach())

    return step


class Graphed:
    """`step(*batch)` replayed as one CUDA graph per batch shape (the full batch and the ragged last one).

    Before a capture the step runs WARMUP_STEPS times on a side stream (lazy initialisation: cuBLAS,
    AdamW's state); the tensors it changed (`state()`: parameters, optimizer state, the tally) are then
    put back, and optimizer state the warm-up created is zeroed (AdamW's fresh state), so the trial
    trains exactly the steps it would have. `capture` and `side_stream` are CUDA's; tests pass stand-ins.
    """

    def __init__(self, step: StepFn, state: Callable[[], list[torch.Tensor]], optimizer: torch.optim.Optimizer,
                 capture: Callable[[StepFn, Sequence[torch.Tensor]], Callable[[], None]] | None = None,
                 side_stream: Callable[[], contextlib.AbstractContextManager] | None = None):
        self.step, self.state, self.optimizer = step, state, optimizer
        self.capture = capture or _cuda_capture
        self.side_stream = side_stream or _cuda_side_stream
        self.graphs: dict[tuple, tuple[list[torch.Tensor], Callable[[], None]]] = {}

    def __call__(self, *batch: torch.Tensor) -> None:
        key = tuple((t.shape, t.dtype) for t in batch)
        if key not in self.graphs:
            self.graphs[key] = self._capture(batch)
        static, replay = self.graphs[key]
        for buffer, t in zip(static, batch, strict=True):
            buffer.copy_(t)
        replay()

    def _capture(self, batch: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Callable[[], None]]:
        static = [t.clone() for t in batch]
        saved = [t.clone() for t in self._live()]
        with self.side_stream():
            for _ in range(WARMUP_STEPS):
                self.step(*static)
        with torch.no_grad():
            for kept, now in zip(saved, self._live(), strict=False):  # the tensors that existed come first
                now.copy_(kept)
            for created in self._live()[len(saved):]:
                created.zero_()
        return static, self.capture(self.step, static)

    def _live(self) -> list[torch.Tensor]:
        """The step's state: the caller's tensors, then AdamW's (created at its first step)."""
        return [*self.state(), *optimizer_tensors(self.optimizer)]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors, in parameter order (none before its first step)."""
    return [v for group in optimizer.param_groups for p in group["params"]
            for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]


def _cuda_side_stream() -> contextlib.AbstractContextManager:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    @contextlib.contextmanager
    def on_side() -> Iterable[None]:
        with torch.cuda.stream(stream):
            yield
        torch.cuda.current_stream().wait_stream(stream)

    return on_side()


def _cuda_capture(step: StepFn, static: Sequence[torch.Tensor]) -> Callable[[], None]:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # its own memory pool: another shape's graph never reuses this one's
        step(*static)
    return graph.replay
