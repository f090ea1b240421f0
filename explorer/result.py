"""What one training run reports (`TrialResult`) and the precision it runs in, free of torch: explorer.train's runs and a task that trains
its own way (bench/standin.py's stand-in) report the same thing, and the evaluator stores it."""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.budget import Compile
from explorer.kappa import BlockKappa


EPOCH_METRICS = ("accuracy", "perplexity", "eval_loss", "train_loss")  # what a run's per-epoch callback may receive


@dataclass
class TrialResult:
    """What one trial reports: `metric` is the task's metric after the last epoch."""

    metric: float
    metrics: dict[str, float]
    curve: list[float]  # the task metric after each epoch
    kappa_init: list[BlockKappa]  # κ per attention block (name, kind, κ) at initialisation
    kappa_final: list[BlockKappa]  # and after training
    params: int
    steps: int
    train_time_s: float
    device: str
    compile: Compile = "none"  # how its steps ran (explorer.steps.compile_used)
    tf32: bool = False
    seed_batch: int = 1  # how many seeds of its configuration trained with it as one model
    device_name: str = "CPU"  # torch.cuda.get_device_name on CUDA
    precision: str = "float32"  # what the forward ran in (`precision`)
    rungs: dict[int, dict[str, float]] = field(default_factory=dict)  # a ladder's lengths: the metrics at each (wsd)
    resumed_from: int | None = None  # wsd: the length of the run whose kept state it continued (explorer.checkpoints.Carry)


def precision(device: str, bf16: bool) -> str:
    """What a trial's forward runs in on `device`: bfloat16 autocast on CUDA when `bf16`, else float32."""
    return "bfloat16" if bf16 and device.startswith("cuda") else "float32"
