"""One short training run of one configuration: the unit of work every executor runs.

`run_trial` builds the family's model, trains it with AdamW (linear warmup, then cosine decay, or a
warmup-stable-decay schedule for a ladder of lengths: explorer.schedule) and cross-entropy for a small
budget, evaluates after every epoch and hands the metrics to a callback, so that a pruner (Optuna) or a
scheduler (Ray Tune) can stop it. Under `wsd` each shorter rung of the budget's ladder branches off the
run at its cooldown's start, decays, is evaluated (`TrialResult.rungs`) and is put back: the run goes
on exactly as if the branch had not happened. It measures the attention blocks' condition numbers
before and after training (`explorer.conditioning`).

A NaN/inf loss raises `TrialFailed`: the trial fails, the study goes on. With a `checkpoint_dir`
the run saves its whole state after an epoch (every epoch, or once `checkpoint_every_s` passed since
the last save) and resumes from it, giving the same result on CPU as an uninterrupted run.

Under wsd a run continues a shorter run of its (configuration, seed) (`carry`: explorer.checkpoints.Carry):
it starts from that run's state at its cooldown start, the state every longer run of the seed passes
through, and trains only the epochs past it (and the cooldowns of the rungs in between), with the result
of a run from scratch, bit for bit on one machine; it keeps its own state at its own cooldown start.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from explorer import checkpoints
from explorer.budget import Budget
from explorer.checkpoints import CHECKPOINT
from explorer.conditioning import attention_condition
from explorer.errors import TrialFailed
from explorer.faults import OutOfMemory
from explorer.families import get_family
from explorer.kappa import BlockKappa
from explorer.schedule import WSD, Rungs, warmup_cosine
from explorer.steps import (Compile, Graphed, StepFn, Tally, adamw, autocast, compile_used, model_step, optimizer_tensors,
                            set_tf32)
from explorer.device_data import Batches
from explorer.result import TrialResult, precision
from explorer.tasks import Loader, Task, TaskData

Callback = Callable[[int, dict[str, float]], None]

KAPPA_SAMPLES = 32  # eval samples on which κ is measured: enough for a stable median, cheap to SVD
_GLOBAL_RNG = threading.Lock()  # held while a trial seeds torch's global RNG and draws its model's initialisation
NAN_CHECK_EVERY = 50  # on CUDA, steps between the host syncs that look for a non-finite loss
KEPT_AT = "kept_at"  # in a kept state's progress: the length of the run that kept it


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"


def run_trial(
    family: str,
    dims: dict[str, Any],
    task: Task,
    budget: Budget,
    callback: Callback | None = None,
    checkpoint_dir: Path | None = None,
    device: str | None = None,
    checkpoint_every_s: float = 0.0,
    carry: checkpoints.Carry | None = None,
) -> TrialResult:
    """Train `family` at `dims` on `task` within `budget`; report each epoch to `callback`.

    `callback(epoch, metrics)` runs after each epoch's evaluation (epochs count from 0; metrics hold
    the task's metric, `eval_loss`, `train_loss`, and `perplexity` for an LM); what it raises (e.g.
    `optuna.TrialPruned`) propagates. Raises `TrialFailed` on a non-finite loss, and `OutOfMemory` (a
    `TrialFailed` saying how much memory the trial needed) when the device runs out of memory anywhere
    in the trial (building, κ, training). κ is measured on the first KAPPA_SAMPLES inputs of the eval
    split, before and after training. A checkpoint is written after an epoch once `checkpoint_every_s`
    passed since the last one (0: every epoch). `carry` (wsd): the kept states of the run's (configuration,
    seed) it may start from when it has no checkpoint, and where it keeps its own.
    """
    device = device or default_device()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)  # what the trial needed, if it runs out of memory
    try:
        return _run(family, dims, task, budget, callback, checkpoint_dir, device, checkpoint_every_s, carry)
    except torch.OutOfMemoryError as err:
        reason = f"out of memory on {device}: {_memory_needed(device, str(err))}{str(err).splitlines()[0]}"
    raise OutOfMemory(reason)  # raised outside the handler, so the traceback no longer pins GPU memory


def _memory_needed(device: str, message: str) -> str:
    """On CUDA, what the trial needed against what the device has (its peak, or what it held plus what it
    asked for when it ran out), to say why it cannot run here; '' elsewhere."""
    if not device.startswith("cuda"):
        return ""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    asked = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", message)
    held = torch.cuda.memory_allocated(device) + (float(asked.group(1)) * units[asked.group(2)] if asked else 0)
    needed = max(torch.cuda.max_memory_allocated(device), held)
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return f"it needed more than {needed / 2**30:.2f} GiB of the {total / 2**30:.2f} GiB of {device_name(device)}; "


def build_model(family: str, dims: dict[str, Any], seed: int) -> nn.Module:
    """The configuration's model as the trial at `seed` initialises it."""
    with _GLOBAL_RNG:  # trials in threads (executor.n_jobs) would interleave their draws from torch's global RNG
        torch.manual_seed(seed)
        return get_family(family).build(dims)


def _run(
    family: str,
    dims: dict[str, Any],
    task: Task,
    budget: Budget,
    callback: Callback | None,
    checkpoint_dir: Path | None,
    device: str,
    checkpoint_every_s: float,
    carry: checkpoints.Carry | None = None,
) -> TrialResult:
    """`run_trial`'s body: build, measure κ, train, measure κ again (any of them may run out of memory)."""
    model = build_model(family, dims, budget.seed).to(device)
    params = sum(p.numel() for p in model.parameters())
    data = task.load(budget.batch_size, budget.seed).to(device)  # in-memory data moves to the device once
    probe = first_batch(data.eval)[:KAPPA_SAMPLES]

    steps_per_epoch = len(data.train)
    total_steps = budget.longest * steps_per_epoch
    if budget.max_steps is not None:
        total_steps = min(total_steps, budget.max_steps)
    mode = compile_used(budget.compile, device)
    set_tf32(budget.tf32)
    optimizer = adamw(((p, p.ndim >= 2) for p in model.parameters() if p.requires_grad), budget.lr,
                      budget.weight_decay, device, graphs=mode == "cudagraphs")
    rungs, wsd = None, None
    if budget.lr_schedule == "wsd":  # the warmup of the shortest rung, the same at every length
        wsd = WSD(max(1, int(budget.warmup_frac * budget.ladder[0] * steps_per_epoch)), steps_per_epoch, budget.cooldown,
                  budget.longest)
        rungs, factor = Rungs.of(budget.ladder, wsd), wsd
    else:
        factor = warmup_cosine(int(budget.warmup_frac * total_steps), total_steps)
        carry = None  # a cosine run's schedule depends on its length all along: nothing to continue
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    path = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir is not None else None
    parts, owner = checkpoints.Parts(model, optimizer, scheduler, data.train), {"family": family, "dims": dict(dims)}
    trajectory = _trajectory(family, dims, budget, device)
    if path is not None and path.exists():
        state = _State(**checkpoints.load(path, owner, parts, device, _GLOBAL_RNG))
    else:
        state = _carried(carry, trajectory, parts, device) or _State(kappa_init=attention_condition(model, probe))
    if wsd is not None:
        wsd.target = budget.longest  # a state kept by a shorter run brings that run's target
    last_save = time.monotonic()

    def checkpoint() -> None:
        nonlocal last_save
        if path is not None and time.monotonic() - last_save >= checkpoint_every_s:
            checkpoints.save(path, owner, parts, vars(state), device)
            last_save = time.monotonic()

    def keep() -> None:
        """At the run's cooldown start, its state for a longer run of its (configuration, seed) to continue from."""
        if carry is not None and carry.keep is not None and wsd is not None and state.epoch == wsd.decay_start(budget.longest):
            checkpoints.save(carry.keep, trajectory, parts, {**vars(state), KEPT_AT: budget.longest}, device)

    _fit(model, mode, data, optimizer, scheduler, budget, device, task, state, total_steps, callback, checkpoint, rungs, keep)
    return TrialResult(
        metric=state.metrics[task.metric],
        metrics=state.metrics,
        curve=state.curve,
        kappa_init=state.kappa_init,
        kappa_final=attention_condition(model, probe),
        params=params,
        steps=state.step,
        train_time_s=state.train_time_s - state.inherited_s,
        device=device,
        compile=mode,
        tf32=budget.tf32,
        device_name=device_name(device),
        precision=precision(device, budget.bf16),
        rungs={**state.rungs, **({state.epoch: state.metrics} if state.epoch == budget.longest else {})} if rungs else {},
        resumed_from=state.resumed_from,
    )


def _trajectory(family: str, dims: dict[str, Any], budget: Budget, device: str) -> dict[str, Any]:
    """What a kept state belongs to: one trajectory of one (configuration, seed), whatever the run's length
    (the budget less its lengths, but with the shortest, which sets the warmup), in one precision."""
    fields = {k: v for k, v in budget.identity().items() if k != "epochs"}
    return {"family": family, "dims": dict(dims), "seed": budget.seed, "budget": {**fields, "warmup_from": budget.ladder[0]},
            "precision": precision(device, budget.bf16)}


def _carried(carry: checkpoints.Carry | None, trajectory: dict[str, Any], parts: checkpoints.Parts, device: str) -> _State | None:
    """The run's state loaded from the latest kept state of its trajectory (`carry.source`), else None: none
    kept, or one of another trajectory (a study changed with --force), or gone meanwhile (a run from
    scratch is correct, only slower). A shorter run's state brings that run's final metrics as its rung."""
    found = carry.source if carry is not None else None
    if found is None:
        return None
    try:
        payload = checkpoints.read(found[0], trajectory)
    except Exception:  # noqa: BLE001  unreadable, partly written by a node that died, another trajectory's: nothing restored yet
        return None
    progress = checkpoints.restore(payload, parts, device, _GLOBAL_RNG)
    state = _State(**{k: v for k, v in progress.items() if k != KEPT_AT})
    length = int(progress[KEPT_AT])
    if length < carry.length:  # another run's state: this run trains on from it
        state.resumed_from, state.inherited_s = length, state.train_time_s
        metrics = carry.metrics(length)
        if metrics is not None:
            state.rungs[length] = metrics
    return state


@dataclass
class _State:
    """Everything about a run's progress that a checkpoint must carry besides the modules."""

    kappa_init: list[BlockKappa]
    epoch: int = 0  # epochs finished
    step: int = 0  # optimizer steps taken
    done: bool = False  # a limit (epochs, max_steps, time) has been reached
    curve: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    train_time_s: float = 0.0
    rungs: dict[int, dict[str, float]] = field(default_factory=dict)  # the shorter rungs' metrics, branched off
    resumed_from: int | None = None  # the length of the run whose kept state this one started from (None: from scratch)
    inherited_s: float = 0.0  # the training seconds that state carried: not this run's


def _fit(
    model: nn.Module,
    mode: Compile,
    data: TaskData,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    budget: Budget,
    device: str,
    task: Task,
    state: _State,
    total_steps: int,
    callback: Callback | None,
    save: Callable[[], None],
    rungs: Rungs | None = None,
    keep: Callable[[], None] | None = None,
) -> None:
    """Epochs until a limit is reached: branch off any rung whose cooldown starts here, keep the state where
    the run's own cooldown starts, train, evaluate, checkpoint, report."""
    is_lm = task.modality == "lm"
    forward: nn.Module = torch.compile(model, dynamic=False) if mode == "compile" else model  # type: ignore[assignment]  # a graph per batch shape
    tally = Tally.on(device)
    step: StepFn = model_step(model, forward, optimizer, budget.grad_clip, autocast(device, budget.bf16, mode == "cudagraphs"), tally)
    if mode == "cudagraphs":
        step = Graphed(step, lambda: [*model.parameters(), *tally.tensors()], optimizer)
    while not state.done:
        started = time.perf_counter()
        for rung in rungs.branches_at(state.epoch) if rungs is not None else []:
            if rung not in state.rungs:
                state.rungs[rung] = _branch(model, forward, step, tally, optimizer, scheduler, data, budget, device,
                                            is_lm, rungs.wsd, state, rung, total_steps)
        if keep is not None:
            keep()
        _set_epoch(data.train, state.epoch)
        model.train()
        train_loss, steps, stopped = _train_epoch(step, tally, data.train, scheduler, budget, device, state, total_steps)
        state.step += steps
        metrics = _evaluate(forward, data.eval, device, autocast(device, budget.bf16), is_lm)
        metrics["train_loss"] = train_loss
        state.epoch += 1
        state.done = stopped or state.epoch >= budget.longest
        state.metrics = metrics
        state.curve.append(metrics[task.metric])
        state.train_time_s += time.perf_counter() - started
        if not math.isfinite(metrics["eval_loss"]):
            raise TrialFailed(f"eval loss is {metrics['eval_loss']} after step {state.step}")
        save()  # before reporting: the checkpoint a report carries (Ray's) holds this epoch
        if callback is not None:
            callback(state.epoch - 1, metrics)


def _branch(model: nn.Module, forward: nn.Module, step: StepFn, tally: Tally, optimizer: torch.optim.Optimizer,
            scheduler: torch.optim.lr_scheduler.LRScheduler, data: TaskData, budget: Budget, device: str, is_lm: bool,
            wsd: WSD, state: _State, rung: int, total_steps: int) -> dict[str, float]:
    """The metrics of the `rung`-epoch run: from here (its cooldown's start) decay towards `rung` on the
    epochs that run would train, evaluate, then put every tensor, the schedule and the RNG back (in place:
    a CUDA graph keeps its buffers; optimizer state the branch created is zeroed, AdamW's fresh state),
    so the main run goes on exactly as if the branch had not happened."""
    kept = _live(model, optimizer, tally)
    saved = [t.detach().clone() for t in kept]
    rates = [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"] for g in optimizer.param_groups]
    last, rng = scheduler.last_epoch, torch.get_rng_state()
    wsd.target = rung
    branch = _State(kappa_init=[], epoch=state.epoch, step=state.step, train_time_s=state.train_time_s)
    metrics: dict[str, float] = {}
    try:
        while branch.epoch < rung and branch.step < total_steps:
            _set_epoch(data.train, branch.epoch)
            model.train()
            train_loss, steps, _ = _train_epoch(step, tally, data.train, scheduler, budget, device, branch, total_steps)
            branch.step += steps
            branch.epoch += 1
            metrics = {**_evaluate(forward, data.eval, device, autocast(device, budget.bf16), is_lm), "train_loss": train_loss}
    finally:
        wsd.target = budget.longest
        with torch.no_grad():
            now = _live(model, optimizer, tally)
            for t, value in zip(now, saved, strict=False):  # the tensors that existed come first
                t.copy_(value)
            for created in now[len(saved):]:
                created.zero_()
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            if isinstance(rate, torch.Tensor):
                group["lr"].copy_(rate)
            else:
                group["lr"] = rate
        scheduler.last_epoch, scheduler._last_lr = last, [float(r) for r in rates]  # noqa: SLF001 - no public setter
        torch.set_rng_state(rng)
    return metrics


def _live(model: nn.Module, optimizer: torch.optim.Optimizer, tally: Tally) -> list[torch.Tensor]:
    """What a training step changes: the model, the tally, then AdamW's state (created at its first step)."""
    return [*model.parameters(), *model.buffers(), *tally.tensors(), *optimizer_tensors(optimizer)]


def _train_epoch(
    step: StepFn,
    tally: Tally,
    loader: Loader,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    budget: Budget,
    device: str,
    state: _State,
    total_steps: int,
) -> tuple[float, int, bool]:
    """One pass over `loader`; returns (mean train loss, steps taken, whether a limit stopped it).

    The loss stays on the device (`tally`): on CPU each step checks it (free), on CUDA every
    NAN_CHECK_EVERY steps, so the GPU is not synchronised on every step.
    """
    sync_every = 1 if device == "cpu" else NAN_CHECK_EVERY
    deadline = None if budget.time_limit_s is None else time.perf_counter() + budget.time_limit_s - state.train_time_s
    tally.start(state.step)
    steps, stopped = 0, False
    for x, y in loader:
        step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))  # a DataLoader's batch; Batches are there
        scheduler.step()
        steps += 1
        if steps % sync_every == 0:
            _check_finite(tally)
        if state.step + steps >= total_steps or (deadline is not None and time.perf_counter() >= deadline):
            stopped = True
            break
    _check_finite(tally)
    return tally.loss_sum.item() / max(steps, 1), steps, stopped


def _check_finite(tally: Tally) -> None:
    step = int(tally.first_bad)
    if step >= 0:
        raise TrialFailed(f"loss is {tally.bad_loss.item()} at step {step}")


@torch.no_grad()
def _evaluate(
    model: nn.Module,
    loader: Loader,
    device: str,
    cast: Callable[[], contextlib.AbstractContextManager],
    is_lm: bool,
) -> dict[str, float]:
    """Mean cross-entropy over all targets (every token for an LM); accuracy or perplexity.

    `model` is the trial's module or its compiled twin."""
    model.eval()
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    count = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with cast():
            logits = model(x)
        logits, y = logits.float().flatten(0, -2), y.flatten()
        loss_sum += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(-1) == y).sum()
        count += y.numel()
    eval_loss = loss_sum.item() / max(count, 1)
    if is_lm:
        return {"eval_loss": eval_loss, "perplexity": math.exp(min(eval_loss, 700.0))}
    return {"accuracy": correct.item() / max(count, 1), "eval_loss": eval_loss}


def first_batch(loader: Loader) -> torch.Tensor:
    batches: Iterator = iter(loader)
    return next(batches)[0]


def _set_epoch(loader: Loader, epoch: int) -> None:
    """Tell epoch-seeded batches (explorer.device_data) or samplers (like DistributedSampler) which epoch this is."""
    samplers = [loader] if isinstance(loader, Batches) else [loader.sampler, loader.batch_sampler]
    for sampler in samplers:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
