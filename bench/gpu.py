"""Trials per hour of the default study's models: one seed at a time vs the seeds as one model, side by side.

    python bench/gpu.py                                   # on CUDA: every configuration, the study's 20 epochs
    python bench/gpu.py --configs 4 --epochs 2            # a quick look (the CPU default)
    python bench/gpu.py --modes none,cudagraphs           # also with each step replayed as a CUDA graph

For each configuration of the study's space (studies/digits-vit-trade.yaml: spaces/vit-digits.yaml at
its budget; `--configs N` takes the first N in the grid's spread order), in one run and alternating which
goes first: its seeds (the study's 3) trained one by one with `explorer.train.run_trial`, and together
with `explorer.seedbatch.run_seeds` (`seed_batch` forced on, so both are timed whatever `auto` would pick),
for each `--modes` way of running a step (explorer.steps: eager, CUDA graphs, compiled). On CUDA a
third row runs one by one with the batches gathered on the host and copied every step, as trials did
before the data moved to the device (`host data`).

Each row prints trials per hour (every trial's whole wall time: building, κ, training, evaluation),
the ratio to one by one (1.00 is no gain; the seed count is what a launch-bound device could reach),
and achieved FLOP/s (3x the family's forward FLOPs per training sample plus the forward per eval sample)
as a share of a peak: a large matmul timed here in the training dtype (bf16 under autocast on CUDA,
fp32 on the CPU), printed with the device's name. The largest difference of a batched trial's final
accuracy from its one-by-one twin is printed too: batching must not change what is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.train_step import matmul_flops  # noqa: E402
from explorer.seedbatch import run_seeds  # noqa: E402
from explorer.steps import compile_used  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402
from explorer.study.queue import spread_order  # noqa: E402
from explorer.tasks import TaskData  # noqa: E402
from explorer.train import Budget, TrialResult, run_trial  # noqa: E402


@contextlib.contextmanager
def host_data() -> Iterator[None]:
    """Trials as before the data moved: batches gathered on the host, copied to the device every step."""
    real = TaskData.to
    TaskData.to = lambda self, device: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        TaskData.to = real  # type: ignore[method-assign]


def timed(run: Callable[[], list[TrialResult]]) -> tuple[float, list[TrialResult]]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    results = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", nargs="?", default=str(ROOT / "studies" / "digits-vit-trade.yaml"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--configs", type=int, default=None, help="the first N configurations in spread order (CPU default 4)")
    parser.add_argument("--epochs", type=int, default=None, help="instead of the study's (CPU default 2)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per configuration instead of the study's")
    parser.add_argument("--modes", default=None, help="comma-separated budget.compile values (CUDA default none,cudagraphs)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the default study gives a trial one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device, cuda = args.device, args.device.startswith("cuda")

    study = load_study_spec(Path(args.study))
    free = study.space.free_dims
    configs = list(study.configs.values())
    configs = [configs[i] for i in spread_order([[c.dims[d] for d in free] for c in configs])]
    configs = configs[: args.configs or (len(configs) if cuda else 4)]
    epochs = args.epochs or (study.spec.budget.epochs if cuda else 2)
    budget: Budget = study.spec.budget.model_copy(update={"epochs": epochs, "seed_batch": "on"})
    seeds = list(range(args.seeds)) if args.seeds else study.seeds
    modes = list(dict.fromkeys(compile_used(m, device) for m in (args.modes or ("none,cudagraphs" if cuda else "none")).split(",")))
    task = study.task

    ways: dict[str, Callable] = {}
    for mode in modes:
        b = budget.model_copy(update={"compile": mode})
        if cuda and mode == "none":
            ways["one by one, host data"] = lambda c, b=b: host_run(c, b)
        ways[f"one by one, {mode}"] = lambda c, b=b: [run_trial(c.family, c.dims, task, b.model_copy(update={"seed": s}), device=device) for s in seeds]
        ways[f"seeds as one, {mode}"] = lambda c, b=b: run_seeds(c.family, c.dims, task, b, seeds, device=device)

    def host_run(c, b: Budget) -> list[TrialResult]:
        with host_data():
            return [run_trial(c.family, c.dims, task, b.model_copy(update={"seed": s}), device=device) for s in seeds]

    seconds = {name: 0.0 for name in ways}
    finals: dict[str, list[float]] = {name: [] for name in ways}
    flops = 0.0
    data = task.load(budget.batch_size, 0)
    n_train, n_eval = len(data.train.dataset), len(data.eval.dataset)
    ways["warm-up"] = lambda c: run_trial(c.family, c.dims, task, budget.model_copy(update={"max_steps": 2, "epochs": 1}), device=device)
    ways.pop("warm-up")(configs[0])  # lazy initialisation (CUDA context, cuBLAS) counts for no way
    for i, cfg in enumerate(configs):
        names = list(ways) if i % 2 == 0 else list(ways)[::-1]
        for name in names:
            spent, results = timed(lambda: ways[name](cfg))
            seconds[name] += spent
            finals[name] += [r.metric for r in results]
        per_sample = study.space.family.flops(cfg.dims)
        flops += len(seeds) * epochs * per_sample * (3 * n_train + n_eval)

    dtype = torch.bfloat16 if cuda and budget.bf16 else torch.float32
    peak = matmul_flops(device, dtype, 8192 if cuda else 1024)
    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} thread(s)"
    trials = len(configs) * len(seeds)
    print(f"device {device} ({name}); {len(configs)} configurations x {len(seeds)} seeds = {trials} trials of "
          f"{epochs} epochs, batch {budget.batch_size}, {'bf16 autocast' if dtype == torch.bfloat16 else 'fp32'}")
    print(f"peak used: a {8192 if cuda else 1024}^2 matmul in {str(dtype).removeprefix('torch.')} timed here, "
          f"{peak / 1e12:.3f} TFLOP/s; training FLOPs {flops / 1e12:.3f} T per way")
    base = f"one by one, {modes[0]}"
    for way, spent in seconds.items():
        diff = max(abs(a - b) for a, b in zip(finals[way], finals[base], strict=True))
        print(f"{way:28s} {3600 * trials / spent:9.0f} trials/h  x{seconds[base] / spent:5.2f}  "
              f"{flops / spent / 1e12:8.4f} TFLOP/s ({100 * flops / spent / peak:6.3f}% of peak)  "
              f"max |Δ final {task.metric}| vs {base}: {diff:.4f}")
    print(f"ratio floor 1.00 (no gain); {len(seeds)}.00 would be the seeds for the price of one")


if __name__ == "__main__":
    main()
