"""A stand-in for training, for benches and tests of the machinery around it: a task whose trial sleeps
`seconds` (spread over `budget.epochs`) and reports a plausible curve, never importing torch.

    task: {name: "bench.standin:StandIn", seconds: 2}

Everything else a trial does is explorer's own: the queue, the sampler, the replicate policy, the
evaluator's attributes, checkpoints every `executor.checkpoint_every_s` (a small JSON file in the
trial's checkpoint folder, which Ray uploads as it does a real one, and a retry resumes from it), and
the storage writes. Its accuracy is a smooth function of the configuration's parameters and heads plus
a seed's noise (sd 0.01), so fronts, replicates and the decide policy have something to decide. Used by
bench/cluster.py (a simulated GPU cluster) and its tests; the folder holding `bench` must be importable
where trials run (Ray's workers get it on PYTHONPATH).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from explorer.budget import Budget
from explorer.checkpoints import CHECKPOINT
from explorer.families import get_family
from explorer.result import TrialResult, precision
from explorer.tasks import Task


class StandIn(Task):
    """Digits-shaped dims (8x8, one channel, 10 classes); trials only sleep."""

    name = "stand-in"
    modality = "image"
    metric = "accuracy"
    higher_is_better = True
    trains_itself = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        seconds: float = Field(2.0, ge=0)  # one trial's training time, all its epochs

    def dims(self) -> dict[str, Any]:
        return {"img_size": 8, "in_chans": 1, "num_classes": 10}

    def load(self, batch_size: int, seed: int) -> Any:
        raise self.error("the stand-in has no data: its trials only sleep (bench/standin.py)")

    def run_trial(self, family: str, dims: dict[str, Any], budget: Budget, *, callback: Callable[[int, dict[str, float]], None] | None,
                  checkpoint_dir: Path | None, device: str | None, checkpoint_every_s: float) -> TrialResult:
        epochs, device = budget.epochs, device or "cpu"
        params = get_family(family).params(dims)
        final = accuracy(params, int(dims["heads"]), budget.seed, json.dumps(dims, sort_keys=True))
        path = checkpoint_dir / CHECKPOINT if checkpoint_dir is not None else None
        curve: list[float] = json.loads(path.read_text())["curve"] if path is not None and path.exists() else []
        saved, start = time.monotonic(), time.perf_counter()
        for epoch in range(len(curve), epochs):
            time.sleep(self.options.seconds / epochs)
            curve.append(round(final * (1 - math.exp(-4 * (epoch + 1) / epochs)) / (1 - math.exp(-4)), 6))
            if path is not None and (checkpoint_every_s == 0 or time.monotonic() - saved >= checkpoint_every_s):
                path.write_text(json.dumps({"curve": curve}))
                saved = time.monotonic()
            if callback is not None:
                callback(epoch, {"accuracy": curve[-1], "eval_loss": 2.3 * (1 - curve[-1]), "train_loss": 2.3 * (1 - curve[-1])})
        kappa = [{"name": f"blocks.{i}.attn", "kind": "token", "kappa": 40.0 / math.sqrt(dims["heads"]) * (1 + i)}
                 for i in range(int(dims["layers"]))]
        return TrialResult(metric=curve[-1], metrics={"accuracy": curve[-1], "eval_loss": 2.3 * (1 - curve[-1])}, curve=curve,
                           kappa_init=kappa, kappa_final=[{**k, "kappa": k["kappa"] * 3} for k in kappa], params=params,
                           steps=epochs * 10, train_time_s=time.perf_counter() - start, device=device,
                           device_name="simulated GPU" if device.startswith("cuda") else "CPU",
                           precision=precision(device, budget.bf16))


def accuracy(params: int, heads: int, seed: int, key: str) -> float:
    """A plausible final accuracy: rising with log parameters, a little with heads, and a seed's noise."""
    digest = hashlib.sha256(f"{key}:{seed}".encode()).digest()
    u, v = (int.from_bytes(digest[i:i + 8], "big") / 2**64 for i in (0, 8))  # uniform in [0, 1)
    z = math.sqrt(-2 * math.log(max(u, 1e-12))) * math.cos(2 * math.pi * v)  # standard normal (Box-Muller)
    return max(0.0, min(1.0, 0.55 + 0.06 * math.log(params / 1000 + 1) + 0.01 * math.log2(heads) + 0.01 * z))
