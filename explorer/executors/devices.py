"""Which device each trial trains on, how many train at once, and the execution class a run records.

`executor.device` (auto | cpu | cuda) and `executor.gpu` resolve into an `Execution`: the device kind,
the precision the budget gives there, the GPUs per trial and how many trials run at once. `auto` takes
the GPUs where there are any; `cuda` where there are none is one line, never a silent CPU run.

Locally, trials are threads of one process, so each is handed an explicit torch device (`cuda:i`) by a
`DevicePool`: the least-loaded GPU first, one trial per GPU unless `gpu` is a fraction (`0.5`: two).
This is Syne Tune's `rotate_gpus`, which does it with CUDA_VISIBLE_DEVICES for trial processes; the
GPUs counted here are those CUDA_VISIBLE_DEVICES leaves visible to torch. On Ray the cluster's
resources decide (explorer.executors.ray_tune), and Ray narrows each worker's CUDA_VISIBLE_DEVICES.

The execution class (`cpu float32`, `cuda bfloat16`) is recorded on the study when a run starts; a run
of another class is refused unless forced (explorer.identity: CPU and GPU results are never compared).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import optuna

from explorer.errors import ExplorerError
from explorer.identity import CLASS, classes, current_key, execution_class
from explorer.study import ExecutorSpec, Study
from explorer.result import precision


@dataclass(frozen=True)
class Execution:
    """A run's resolved devices: `device` ("cpu" or "cuda"), the `precision` its forward runs in, `gpu`
    per trial (0 on a CPU), `slots` (trials at once) and `where` (the devices, in words)."""

    device: str
    precision: str
    gpu: float
    slots: int
    where: str

    @property
    def name(self) -> str:
        """The execution class."""
        return execution_class(self.device, self.precision)

    def line(self, bf16: bool) -> str:
        """What the run trains on, in one line: `explorer run` says it before the first trial."""
        share = f", {self.gpu:g} GPU per trial" if self.device == "cuda" else ""
        note = " (budget.bf16 applies on CUDA only)" if bf16 and self.device == "cpu" else ""
        return f"trains on {self.where}: {self.slots} trial{'s' if self.slots != 1 else ''} at once{share}, in {self.precision}{note}"


def resolve(spec: ExecutorSpec, gpus: int, where: str, source: str, flag: str | None = None) -> tuple[str, float]:
    """(device kind, GPUs per trial) for `spec` where `gpus` GPUs exist (`where` names them); `flag`: the
    command-line flag that set the device, which an error then names instead of the YAML field."""
    if spec.device == "cpu" and spec.gpu:
        raise ExplorerError(f"gpu: {spec.gpu:g} with device: cpu; drop one", source=source, field="executor.gpu")
    wants_gpu = spec.device == "cuda" or (spec.device == "auto" and gpus > 0 and spec.gpu != 0)
    if not wants_gpu:
        return "cpu", 0.0
    if gpus == 0:
        asked, fix = (f"{flag} cuda", f"pass {flag} cpu (or auto)") if flag else ("device: cuda", "set executor.device: cpu (or auto)")
        raise ExplorerError(f"{asked}, but {where} has no GPU (torch.cuda.is_available() is False, or "
                            f"CUDA_VISIBLE_DEVICES hides them); {fix} to train on CPUs",
                            source=None if flag else source, field=None if flag else "executor.device")
    gpu = 1.0 if spec.gpu is None else spec.gpu
    if gpu == 0:
        raise ExplorerError("gpu: 0 with device: cuda; a GPU trial needs a GPU share (1, or 0.5 for two per GPU)",
                            source=source, field="executor.gpu")
    if gpu > 1:
        raise ExplorerError(f"gpu: {gpu:g}: a trial trains on one GPU; give it 1 (or a fraction to share one)",
                            source=source, field="executor.gpu")
    return "cuda", gpu


def per_gpu(gpu: float) -> int:
    """Trials one GPU holds at a share of `gpu` each (0.5: 2, 0.3: 3)."""
    return max(1, math.floor(1 / gpu + 1e-9))


def visible_gpus() -> list[str]:
    """The names of the GPUs torch sees here (those CUDA_VISIBLE_DEVICES leaves), in torch's order."""
    import torch  # here: a Ray worker that only resolves the cluster's devices, or trains no torch model, never loads it

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def local_execution(study: Study) -> Execution:
    """This machine's devices for `study`: its GPUs (as torch sees them) or its CPU."""
    spec, source = study.spec.executor, str(study.source)
    visible = visible_gpus()
    gpus = len(visible)
    device, gpu = resolve(spec, gpus, "this machine", source, study.flags.get("device"))
    bf16 = study.spec.budget.bf16
    if device == "cpu":
        return Execution("cpu", precision("cpu", bf16), 0.0, spec.n_jobs or 1, "this machine's CPU")
    names = Counter(visible)
    where = f"{gpus} GPU{'s' if gpus > 1 else ''} ({', '.join(f'{n}x {name}' if n > 1 else name for name, n in names.items())})"
    slots = gpus * per_gpu(gpu)
    return Execution("cuda", precision("cuda", bf16), gpu, min(spec.n_jobs or slots, slots), where)


def cluster_execution(study: Study, nodes: list[dict[str, float]]) -> Execution:
    """A Ray cluster's devices for `study`, from its alive nodes' resources (`ray.nodes()`): GPUs if it has
    any (`device: auto`), and as many trials at once as its nodes hold, or `max_concurrent` if fewer.

    A trial no node can hold is one line now: Ray would leave it pending, saying so only in a log file.
    """
    spec, source = study.spec.executor, str(study.source)
    gpus = sum(n.get("GPU", 0.0) for n in nodes)
    device, gpu = resolve(spec, math.ceil(gpus), "the Ray cluster", source, study.flags.get("device"))
    fits = [min(math.floor(n.get("CPU", 0.0) / spec.cpu + 1e-9),
                math.floor(n.get("GPU", 0.0) / gpu + 1e-9) if gpu else math.inf) for n in nodes]
    capacity = int(sum(fits))
    if capacity == 0:
        have = "; ".join(f"{n.get('CPU', 0):g} CPUs, {n.get('GPU', 0):g} GPUs" for n in nodes) or "none alive"
        short = "gpu" if gpu and not any(n.get("GPU", 0.0) >= gpu for n in nodes) else "cpu"
        raise ExplorerError(f"a trial asks for {spec.cpu:g} CPUs{f' and {gpu:g} GPU' if gpu else ''}, and no node of the Ray "
                            f"cluster has that (its nodes: {have}); lower executor.{short} or add a node that has it",
                            source=source, field=f"executor.{short}")
    kind = f"{gpus:g} GPUs" if device == "cuda" else f"{sum(n.get('CPU', 0.0) for n in nodes):g} CPUs"
    where = f"the Ray cluster's {kind} on {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    return Execution(device, precision(device, study.spec.budget.bf16), gpu, min(spec.max_concurrent or capacity, capacity), where)


class DevicePool:
    """The GPUs of this process's trials: each trial leases one for its run, the least loaded first.

    A GPU holds `per_gpu(gpu)` trials at once. A lease `alone` waits for a GPU no other trial holds and
    keeps it to itself (a trial that ran out of memory beside others is measured so); while one waits, no
    trial joins a GPU another holds, so a GPU empties for it. A lease knows whether another trial shared
    its GPU while it ran (`Lease.shared`): running out of memory then is not the configuration's fault.
    """

    def __init__(self, execution: Execution, gpus: int | None = None):
        self.execution = execution
        count = gpus if gpus is not None else (len(visible_gpus()) if execution.device == "cuda" else 0)
        self.capacity = per_gpu(execution.gpu) if execution.device == "cuda" else 0
        self._held: list[list[Lease]] = [[] for _ in range(count)]
        self._alone: list[bool] = [False] * count
        self._waiting_alone = 0
        self._changed = threading.Condition()

    @contextmanager
    def lease(self, alone: bool = False) -> Iterator[Lease]:
        if self.execution.device == "cpu":
            yield Lease("cpu")
            return
        with self._changed:
            self._waiting_alone += alone
            try:
                self._changed.wait_for(lambda: self._free(alone) is not None)
            finally:
                self._waiting_alone -= alone
            index = self._free(alone)
            lease = Lease(f"cuda:{index}")
            for other in self._held[index]:
                other.shared = lease.shared = True
            self._held[index].append(lease)
            self._alone[index] = alone
        try:
            yield lease
        finally:
            with self._changed:
                self._held[index].remove(lease)
                self._alone[index] = False
                self._changed.notify_all()

    def _free(self, alone: bool) -> int | None:
        """The GPU a lease would take now: the least loaded one it may join, or None."""
        if alone:
            empty = [i for i, held in enumerate(self._held) if not held]
            return empty[0] if empty else None
        joinable = [i for i, held in enumerate(self._held) if len(held) < self.capacity and not self._alone[i]
                    and not (held and self._waiting_alone)]
        return min(joinable, key=lambda i: len(self._held[i])) if joinable else None


@dataclass
class Lease:
    """A trial's device while it runs, and whether another trial shared it meanwhile."""

    device: str
    shared: bool = False


def settle_class(study: Study, ostudy: optuna.Study, execution: Execution, force: bool = False) -> None:
    """Record the class this run trains under on the study, or refuse it when the study's trials ran under
    another (its `train_time_s`, its seeds' pairing and its results would be compared across devices).

    With `force` the study goes on under the new class; the trials of the other stay stored, set aside.
    """
    stored = current_key(ostudy).execution
    others = sorted(({stored} if stored else set(classes(ostudy))) - {execution.name})
    if others and not force:
        kind = others[0].split()[0]
        raise ExplorerError(f"this study's trials ran as {' and '.join(others)}, and this run would train as {execution.name} on "
                            f"{execution.where}: set executor.device: {kind} (or --device {kind}) to go on as before, or "
                            f"rerun with --force to go on as {execution.name} (the others are kept, set aside: results of "
                            "two execution classes are never compared)", source=str(study.source), field="executor.device")
    if stored != execution.name:
        ostudy.set_user_attr(CLASS, execution.name)
        if others:  # forced: a grid queues its configurations again, none being measured under this class
            study.queue.grid(ostudy)
    study.evaluator.execution = execution.name
