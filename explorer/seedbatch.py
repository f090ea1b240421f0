"""Seed batching: the replicate seeds of one configuration trained at once, as one vmapped model.

A small model leaves a GPU waiting on kernel launches (a step of the default models is 140-600 short
kernels). The seeds of one configuration share every shape, so their parameters are stacked
(`torch.func.stack_module_state`) and one `functional_call` under `vmap` launches each kernel once for
all of them. Each seed keeps what it has alone: its initialisation (`build_model` at its seed), its
data order (its own permutation of the one copy of the data on the device), its mean loss, its own
gradient clipping, its AdamW state (AdamW is elementwise: one AdamW over the stacked parameters is
each seed's own), its metrics, κ and failure (a NaN in one seed leaves the others training). So the
results equal training the seeds one by one, within float tolerance (tests/test_seedbatch.py).
`budget.seed_batch` says when (`worth_batching`: measured on the device, never assumed).

Trained one by one instead (`NotBatchable`, with the reason): a wall-clock limit (a seed's steps would
depend on its neighbours' speed), data a DataLoader reads lazily, seeds that do not share one data set,
a model with dropout or batch-norm statistics (vmap cannot reproduce each seed's own random stream or
running buffers), and a group that runs out of memory before its first report.
A group keeps no checkpoints: a killed group's trials train again from the start.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from explorer.conditioning import attention_condition
from explorer.device_data import Batches
from explorer.errors import TrialFailed, TrialReclaimed
from explorer.families import get_family
from explorer.steps import Graphed, StepFn, Tally, adamw, autocast, compile_used, model_step, set_tf32
from explorer.tasks import Task
from explorer.train import (
    KAPPA_SAMPLES,
    NAN_CHECK_EVERY,
    Budget,
    Callback,
    TrialResult,
    build_model,
    default_device,
    first_batch,
)
from explorer.schedule import warmup_cosine

Outcome = TrialResult | BaseException  # per seed: its result, or why it has none (TrialFailed, a callback's error)
RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
RUNNING_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
PROBE_WARMUP, PROBE_STEPS = 3, 10  # steps of `probe` before timing, and timed
_CHOICES: dict[tuple, bool] = {}  # worth_batching's measured answers, by configuration, group size and device
_CHOICES_LOCK = threading.Lock()  # one probe at a time: two at once on one device would time each other


class NotBatchable(Exception):
    """These seeds cannot train as one model here; train them one by one."""


def run_seeds(family: str, dims: dict[str, Any], task: Task, budget: Budget, seeds: Sequence[int],
              callbacks: Sequence[Callback | None] | None = None, device: str | None = None) -> list[Outcome]:
    """Train `family` at `dims` at each of `seeds` (`budget.seed` is ignored) as one model; an outcome per seed.

    `callbacks[i](epoch, metrics)` runs after each epoch for seed i, as `run_trial`'s callback does; an
    Exception it raises (e.g. `optuna.TrialPruned`) becomes seed i's outcome and seed i reports no
    more, while the others go on; a BaseException (KeyboardInterrupt) stops the group. A non-finite loss
    fails that seed alone, with `run_trial`'s reason. Raises NotBatchable before training when the
    group cannot train as one (see the module's docstring).
    """
    device = device or default_device()
    if budget.time_limit_s is not None:
        raise NotBatchable("a wall-clock limit (time_limit_s) makes a seed's steps depend on the group's speed")
    if budget.lr_schedule != "cosine":
        raise NotBatchable("a warmup-stable-decay run branches off its shorter rungs one seed at a time")
    group = _Group(family, dims, task, budget, list(seeds), device)
    try:
        return group.train(list(callbacks or [None] * len(seeds)))
    except torch.OutOfMemoryError as err:
        reason = f"out of memory on {device} with {len(seeds)} seeds at once: {str(err).splitlines()[0]}"
    if not group.reported:
        raise NotBatchable(reason)
    return [TrialFailed(reason) if out is None else out for out in group.outcomes]


class _Group:
    """The seeds' models stacked: their parameters, one AdamW, the data, and the epoch loop."""

    def __init__(self, family: str, dims: dict[str, Any], task: Task, budget: Budget, seeds: list[int], device: str):
        self.budget, self.seeds, self.device, self.n = budget, seeds, device, len(seeds)
        self.is_lm, self.metric = task.modality == "lm", task.metric
        self.models = [build_model(family, dims, s) for s in seeds]
        random = [name for name, m in self.models[0].named_modules() if _random_or_running(m)]
        if random:
            raise NotBatchable(f"{random[0]} draws random numbers or keeps running statistics in training")
        loads = [task.load(budget.batch_size, s) for s in seeds]
        if not all(isinstance(d.train, Batches) and isinstance(d.eval, Batches) for d in loads):
            raise NotBatchable("the task reads its data lazily (a DataLoader), not from memory")
        if not all(d.train.dataset.same(loads[0].train.dataset) and d.eval.dataset.same(loads[0].eval.dataset)
                   for d in loads[1:]):
            raise NotBatchable("the task's seeds do not share one data set")
        self.orders = [d.train for d in loads]  # each seed's epoch order
        self.data, self.eval = loads[0].train.dataset.to(device), loads[0].eval.to(device)
        self.models = [m.to(device) for m in self.models]
        self.probe = first_batch(self.eval)[:KAPPA_SAMPLES]
        self.params, self.buffers = stack_module_state(self.models)
        with torch.device("meta"):  # the structure functional_call runs, weight ties included; no memory, no RNG draws
            self.base = get_family(family).build(dims)
        self.mode = compile_used(budget.compile, device)
        set_tf32(budget.tf32)
        decay = {name: p.ndim >= 2 for name, p in self.models[0].named_parameters()}
        self.optimizer = adamw(((p, decay[name]) for name, p in self.params.items()), budget.lr,
                               budget.weight_decay, device, graphs=self.mode == "cudagraphs")
        self.total = budget.longest * len(self.orders[0])
        if budget.max_steps is not None:
            self.total = min(self.total, budget.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_cosine(int(budget.warmup_frac * self.total), self.total))
        self.tally = Tally.on(device, (self.n,))
        self.outcomes: list[Outcome | None] = [None] * self.n
        self.curves: list[list[float]] = [[] for _ in seeds]
        self.metrics: list[dict[str, float]] = [{} for _ in seeds]
        self.reported = False  # a callback has run: too late to train the seeds one by one instead
        self.steps = 0

    def forward(self, in_dims: tuple[int | None, ...]) -> Callable[..., torch.Tensor]:
        """The seeds' forward as one call: vmap over the stacked parameters (and the inputs when in_dims[2] is 0)."""

        def one(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return functional_call(self.base, (params, buffers), (x,))

        batched = vmap(one, in_dims=in_dims)
        if self.mode == "compile":
            batched = torch.compile(batched, dynamic=False)
        # on the CPU PyTorch has no vmap rule for its fused attention: the math path has one (on CUDA all have)
        cpu = self.device == "cpu"

        def call(x: torch.Tensor) -> torch.Tensor:
            with sdpa_kernel([SDPBackend.MATH]) if cpu else contextlib.nullcontext():
                return batched(self.params, self.buffers, x)

        return call

    def step(self) -> StepFn:
        """The group's training step on a batch (x, y) of shape (seeds, batch, ...), as `budget.compile` runs it."""
        step: StepFn = _group_step(self.forward((0, 0, 0)), list(self.params.values()), self.optimizer, self.budget.grad_clip,
                                   autocast(self.device, self.budget.bf16, self.mode == "cudagraphs"), self.tally, self.n)
        if self.mode == "cudagraphs":
            step = Graphed(step, lambda: [*self.params.values(), *self.tally.tensors()], self.optimizer)
        return step

    def train(self, callbacks: list[Callback | None]) -> list[Outcome]:
        budget, started = self.budget, time.perf_counter()
        self.kappa_init = [attention_condition(m, self.probe) for m in self.models]
        step = self.step()
        evaluate = self.forward((0, 0, None))
        epoch, done = 0, False
        while not done:
            train_loss = self._epoch(step, epoch)
            epoch += 1
            done = self.steps >= self.total or epoch >= budget.longest
            self.base.eval()
            per_seed = _evaluate(evaluate, self.eval, self.device, autocast(self.device, budget.bf16), self.is_lm, self.n)
            self.base.train()
            for i, metrics in enumerate(per_seed):
                self._report(i, epoch - 1, {**metrics, "train_loss": float(train_loss[i])}, callbacks[i])
            if all(out is not None for out in self.outcomes):
                break
        return self._results(time.perf_counter() - started)

    def _epoch(self, step: StepFn, epoch: int) -> list[float]:
        """One pass of every seed over its own order of the data; the mean train loss per seed."""
        sync_every = 1 if self.device == "cpu" else NAN_CHECK_EVERY
        orders = torch.stack([o.order(epoch) for o in self.orders]).to(self.device)  # (seeds, n): one copy an epoch
        self.base.train()
        self.tally.start(self.steps)
        taken = 0
        for part in self.orders[0].slices():
            step(*self.data[orders[:, part]])  # (seeds, batch, ...) in one gather
            self.scheduler.step()
            taken += 1
            if taken % sync_every == 0:
                self._fail_non_finite()
            if self.steps + taken >= self.total:
                break
        self.steps += taken
        self._fail_non_finite()
        return (self.tally.loss_sum / max(taken, 1)).tolist()

    def _fail_non_finite(self) -> None:
        for i, (bad, loss) in enumerate(zip(self.tally.first_bad.tolist(), self.tally.bad_loss.tolist(), strict=True)):
            if bad >= 0 and self.outcomes[i] is None:
                self.outcomes[i] = TrialFailed(f"loss is {loss} at step {bad}")

    def _report(self, i: int, epoch: int, metrics: dict[str, float], callback: Callback | None) -> None:
        if self.outcomes[i] is not None:
            return
        if not math.isfinite(metrics["eval_loss"]):
            self.outcomes[i] = TrialFailed(f"eval loss is {metrics['eval_loss']} after step {self.steps}")
            return
        self.metrics[i] = metrics
        self.curves[i].append(metrics[self.metric])
        if callback is not None:
            self.reported = True
            try:
                callback(epoch, metrics)
            except (Exception, TrialReclaimed) as err:  # noqa: BLE001  # this seed's outcome (pruned, reclaimed, ...); the others go on
                self.outcomes[i] = err

    def _results(self, seconds: float) -> list[Outcome]:
        out: list[Outcome] = []
        with torch.no_grad():
            for i, model in enumerate(self.models):
                if self.outcomes[i] is not None:
                    out.append(self.outcomes[i])  # type: ignore[arg-type]
                    continue
                for name, p in model.named_parameters():
                    p.copy_(self.params[name][i])
                out.append(TrialResult(
                    metric=self.metrics[i][self.metric], metrics=self.metrics[i], curve=self.curves[i],
                    kappa_init=self.kappa_init[i], kappa_final=attention_condition(model, self.probe),
                    params=sum(p.numel() for p in model.parameters()), steps=self.steps,
                    train_time_s=seconds / self.n,  # the group's time, shared: what this seed cost
                    device=self.device, compile=self.mode, tf32=self.budget.tf32, seed_batch=self.n))
        return out


def worth_batching(family: str, dims: dict[str, Any], task: Task, budget: Budget, n: int, device: str) -> bool:
    """Whether `n` seeds of this configuration should train as one model on `device` (`budget.seed_batch`).

    `on`/`off` say so. `auto`: never on the CPU (there a step costs its arithmetic, not its launches:
    bench/gpu.py measured one model of 3 seeds at 0.8-1.1x the trials per hour of one by one on 2
    cores); elsewhere a timing probe (`probe`), once per configuration, group size and device in a process.
    """
    if n < 2 or budget.seed_batch == "off":
        return False
    if budget.seed_batch == "on":
        return True
    if device == "cpu":
        return False
    key = (family, json.dumps(dims, sort_keys=True, default=str), n, device, budget.batch_size, budget.bf16, budget.compile)
    with _CHOICES_LOCK:
        if key not in _CHOICES:
            try:
                alone, together = probe(family, dims, task, budget, n, device)
                _CHOICES[key] = together < n * alone
            except NotBatchable:
                _CHOICES[key] = False
        return _CHOICES[key]


def probe(family: str, dims: dict[str, Any], task: Task, budget: Budget, n: int, device: str,
          steps: int = PROBE_STEPS) -> tuple[float, float]:
    """Seconds per training step of one model alone and of `n` seeds as one, measured here on the task's
    first batch after PROBE_WARMUP steps (a CUDA graph captured, where `budget.compile` asks for one;
    `compile` is probed eagerly: compiling twice would cost more than the probe saves)."""
    budget = budget.model_copy(update={"compile": "none" if budget.compile == "compile" else budget.compile, "time_limit_s": None})
    group = _Group(family, dims, task, budget, list(range(n)), device)
    model = build_model(family, dims, 0).to(device).train()
    mode = compile_used(budget.compile, device)
    optimizer = adamw(((p, p.ndim >= 2) for p in model.parameters()), budget.lr, budget.weight_decay, device,
                      graphs=mode == "cudagraphs")
    tally = Tally.on(device)
    alone: StepFn = model_step(model, model, optimizer, budget.grad_clip, autocast(device, budget.bf16, mode == "cudagraphs"), tally)
    if mode == "cudagraphs":
        alone = Graphed(alone, lambda: [*model.parameters(), *tally.tensors()], optimizer)
    order = torch.stack([o.order(0) for o in group.orders]).to(device)[:, group.orders[0].slices()[0]]
    batch = group.data[order]
    return _seconds(alone, [t[0] for t in batch], device, steps), _seconds(group.step(), batch, device, steps)


def _seconds(step: StepFn, batch: Sequence[torch.Tensor], device: str, steps: int) -> float:
    for _ in range(PROBE_WARMUP):
        step(*batch)
    _sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        step(*batch)
    _sync(device)
    return (time.perf_counter() - started) / steps


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _random_or_running(module: nn.Module) -> bool:
    """Dropout (or timm's DropPath) that draws in training, or batch norm that updates running statistics."""
    if isinstance(module, RANDOM_MODULES):
        return module.p > 0
    if isinstance(module, RUNNING_MODULES):
        return module.track_running_stats
    return float(getattr(module, "drop_prob", 0) or 0) > 0


def _group_step(forward: Callable[[torch.Tensor], torch.Tensor], params: list[torch.Tensor], optimizer: torch.optim.Optimizer,
                grad_clip: float | None, cast: Callable[[], contextlib.AbstractContextManager], tally: Tally, n: int) -> StepFn:
    """`model_step` for stacked seeds: each seed's mean loss, its gradients clipped by its own norm."""

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with cast():
            logits = forward(x)
        logits = logits.float().reshape(n, -1, logits.shape[-1])
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(n, -1).mean(1)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # the seeds share no parameter: each gets its own loss's gradient
        if grad_clip is not None:
            grads = [p.grad for p in params if p.grad is not None]
            norms = torch.cat([g.reshape(n, -1) for g in grads], dim=1).norm(dim=1)
            scale = (grad_clip / (norms + 1e-6)).clamp(max=1.0)  # as clip_grad_norm_, per seed
            for g in grads:
                g.mul_(scale.view(n, *[1] * (g.ndim - 1)))
        optimizer.step()
        tally.add(losses.detach())

    return step


@torch.no_grad()
def _evaluate(forward: Callable[[torch.Tensor], torch.Tensor], loader: Batches, device: str,
              cast: Callable[[], contextlib.AbstractContextManager], is_lm: bool, n: int) -> list[dict[str, float]]:
    """`run_trial`'s evaluation for every seed at once: the same eval batches through each seed's parameters."""
    loss_sum = torch.zeros(n, device=device, dtype=torch.float64)
    correct = torch.zeros(n, device=device, dtype=torch.int64)
    count = 0
    for x, y in loader:
        with cast():
            logits = forward(x)
        logits, y = logits.float().reshape(n, -1, logits.shape[-1]), y.flatten()
        loss_sum += F.cross_entropy(logits.flatten(0, 1), y.repeat(n), reduction="none").view(n, -1).sum(1)
        correct += (logits.argmax(-1) == y).sum(1)
        count += y.numel()
    losses = (loss_sum / max(count, 1)).tolist()
    if is_lm:
        return [{"eval_loss": loss, "perplexity": math.exp(min(loss, 700.0))} for loss in losses]
    return [{"accuracy": c / max(count, 1), "eval_loss": loss} for c, loss in zip(correct.tolist(), losses, strict=True)]
