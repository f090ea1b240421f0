"""What a promotion costs: a 10-epoch run continued to 20 epochs against the 20-epoch run of the same
configuration and seed from scratch, side by side in one run, and the disk a study keeps per run.

    python bench/continuation.py [--config layers=3,heads=4] [--seeds 3] [--quick]

The default study's model and budget (studies/digits-vit-trade.yaml: the vit-digits space, a 10/20-epoch
warmup-stable-decay ladder, batch 64, one torch thread as its trials have). Per seed: the 10-epoch run,
which keeps its state at its cooldown start (explorer.checkpoints.Carry); then, in alternating order, the
20-epoch run that continues it and the 20-epoch run from scratch. Each is timed whole (`run_trial`: the
model built, kappa measured, trained, evaluated), its optimizer steps counted, and the two 20-epoch results
compared (they must be identical: metrics and curve). Under warmup-stable-decay the continued run trains
epochs 8 to 20 (12) where the run from scratch trains 20 and its 10-epoch branch's 2 (22): 12/22 = 0.55
is the epochs' ratio; what a run costs besides its epochs (building, kappa, evaluating) is in both.

Disk: a kept state (`KEY-seedS/L.pt` and its metrics) is measured for the run above, and for every
configuration of the space: each model after one AdamW step, written as a kept state is. A study keeps
at most one per (configuration, seed) whose longest run is below the ladder's longest.

The last line: `continuation ratio R disk_mb M`: R the median over seeds of continued / scratch seconds
(target <= 0.6), M the mean megabytes a (configuration, seed) keeps over the space's configurations.
`--quick` (tests/test_bench.py): a 2/4-epoch ladder, one seed, batch 128; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from explorer import checkpoints  # noqa: E402
from explorer.budget import Budget  # noqa: E402
from explorer.steps import adamw  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402
from explorer.train import build_model, run_trial  # noqa: E402

STUDY = ROOT / "studies" / "digits-vit-trade.yaml"


def timed(cfg: Any, task: Any, budget: Budget, carry: checkpoints.Carry | None) -> tuple[Any, float, int]:
    """One run through `run_trial`: its result, wall seconds and optimizer steps."""
    steps = [0]
    hook = register_optimizer_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    try:
        start = time.perf_counter()
        result = run_trial(cfg.family, cfg.dims, task, budget, device="cpu", carry=carry)
        return result, time.perf_counter() - start, steps[0]
    finally:
        hook.remove()


def kept_bytes(folder: Path, length: int) -> int:
    return sum(p.stat().st_size for p in folder.glob(f"{length}.*"))


def state_bytes(cfg: Any, task: Any, budget: Budget, folder: Path) -> int:
    """The size of a kept state of `cfg` (its model and AdamW's moments after one step), written as a run keeps it."""
    model = build_model(cfg.family, cfg.dims, 0)
    optimizer = adamw(((p, p.ndim >= 2) for p in model.parameters()), budget.lr, budget.weight_decay, "cpu")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    data = task.load(budget.batch_size, 0)
    x, y = next(iter(data.train))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    path = folder / f"{cfg.key}.pt"
    checkpoints.save(path, {"config": cfg.key}, checkpoints.Parts(model, optimizer, scheduler, data.train),
                     {"epoch": 8, "curve": [0.0] * 8, "metrics": {"accuracy": 0.0}}, "cpu")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="layers=3,heads=4", help="a configuration of the default study's space")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 2/4-epoch ladder, one seed, batch 128 (tests/test_bench.py)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    study = load_study_spec(STUDY)
    budget = study.spec.budget
    if args.quick:
        budget, args.seeds = budget.model_copy(update={"epochs": [2, 4], "batch_size": 128}), 1
    short, long = budget.ladder
    cfg, task = study.configs[args.config], study.task
    print(f"{cfg.key} ({cfg.params:,} params) on {task.name}: budget epochs {budget.ladder}, batch {budget.batch_size}, "
          f"lr {budget.lr}, cooldown {budget.cooldown}; 1 torch thread, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    ratios, kept = [], []
    with tempfile.TemporaryDirectory(prefix="explorer-continuation-") as tmp:
        for seed in range(args.seeds):
            folder = Path(tmp) / f"seed{seed}"
            at = {n: budget.at(n).model_copy(update={"seed": seed}) for n in (short, long)}
            first, first_s, _ = timed(cfg, task, at[short], checkpoints.Carry(folder, short, long))
            checkpoints.Carry(folder, short, long).ended(first.metrics)
            kept.append(kept_bytes(folder, short))
            runs = {}
            for name in (("continued", "scratch") if seed % 2 == 0 else ("scratch", "continued")):  # alternating: load drifts
                runs[name] = timed(cfg, task, at[long], checkpoints.Carry(folder, long, long) if name == "continued" else None)
            (cont, cont_s, cont_steps), (scratch, scratch_s, scratch_steps) = runs["continued"], runs["scratch"]
            same = cont.metrics == scratch.metrics and cont.curve == scratch.curve and cont.resumed_from == short
            per_epoch = scratch_steps / budget.compute(long)
            ratios.append(cont_s / scratch_s)
            print(f"seed {seed}: {short} epochs {first_s:.1f} s (kept {kept[-1] / 2**20:.2f} MB); {long} epochs continued "
                  f"{cont_s:.1f} s ({cont_steps / per_epoch:g} epochs trained) vs from scratch {scratch_s:.1f} s "
                  f"({scratch_steps / per_epoch:g} epochs): {ratios[-1]:.3f}; identical: {'yes' if same else 'NO'}", flush=True)
            if not same:
                raise SystemExit("the continued run differs from the run from scratch")
        sizes = {c.key: state_bytes(c, task, budget, Path(tmp)) for c in study.configs.values()}
    epochs = budget.compute(long, after=short) / budget.compute(long)
    print(f"continued / from scratch: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
          f"{args.seeds} seeds); the epochs' ratio {budget.compute(long, after=short)}/{budget.compute(long)} = {epochs:.3f}")
    mb = [s / 2**20 for s in sizes.values()]
    print(f"kept per (configuration, seed): {statistics.median(kept) / 2**20:.2f} MB for {cfg.key} as its run kept it; over the "
          f"space's {len(mb)} configurations {min(mb):.2f} to {max(mb):.2f} MB, mean {statistics.mean(mb):.2f} "
          f"(a study of {len(mb)} x {len(study.seeds)} seeds at most {sum(mb) * len(study.seeds):.0f} MB, none once each "
          f"seed's longest run is at {long} epochs)")
    print(f"continuation ratio {statistics.median(ratios):.2f} disk_mb {statistics.mean(mb):.2f}")


if __name__ == "__main__":
    main()
