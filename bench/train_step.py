"""Training throughput of explorer's image encoder against timm's VisionTransformer, side by side.

Both models get the same depth, heads, width, MLP, patch and image size (timm with a class token,
token pooling, qkv bias: the same architecture and parameter count), the same batch on the same
device, and the same step as `explorer.train.run_trial` takes: forward under bf16 autocast on CUDA
(fp32 on CPU), cross-entropy, backward, gradient clipping, AdamW. Rounds alternate between the two
models so that clock or thermal drift (or a busy shared machine) hits both: the best round of each
counts, and the median ratio over paired rounds says how stable that is. Achieved FLOP/s use the
family's forward FLOPs x 3 (forward + backward) against a large matmul timed in the same dtype.

    python bench/train_step.py                       # CPU-sized default
    python bench/train_step.py --preset vit-s --batch 256   # ViT-S/16 at 224 on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable

import timm
import torch
import torch.nn.functional as F
from torch import nn

from explorer.families import get_family

PRESETS = {
    "tiny": dict(layers=4, heads=4, width=128, mlp=512, img_size=32, patch=4),
    "vit-s": dict(layers=12, heads=6, width=384, mlp=1536, img_size=224, patch=16),
    "vit-b": dict(layers=12, heads=12, width=768, mlp=3072, img_size=224, patch=16),
}


def timm_vit(d: dict) -> nn.Module:
    return timm.models.vision_transformer.VisionTransformer(
        img_size=d["img_size"], patch_size=d["patch"], in_chans=d["in_chans"], num_classes=d["num_classes"],
        embed_dim=d["width"], depth=d["layers"], num_heads=d["heads"], mlp_ratio=d["mlp"] / d["width"],
        qkv_bias=True, class_token=True, global_pool="token",
    )


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def train_step(model: nn.Module, device: str, bf16: bool) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The step run_trial takes, without its bookkeeping."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def seconds_per_step(step: Callable, x: torch.Tensor, y: torch.Tensor, steps: int, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    sync(device)
    return (time.perf_counter() - start) / steps


def matmul_flops(device: str, dtype: torch.dtype, n: int, repeats: int = 10) -> float:
    """FLOP/s of an n x n matmul: the machine's practical peak for this dtype."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    torch.matmul(a, b)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device, cuda = args.device, args.device.startswith("cuda")
    dims = {**PRESETS[args.preset], "in_chans": 3, "num_classes": 1000 if args.preset != "tiny" else 10}
    family = get_family("image-encoder")
    dims = {**family.defaults(), **dims}
    torch.manual_seed(0)
    models = {"explorer": family.build(dims).to(device), "timm": timm_vit(dims).to(device)}
    counts = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    assert counts["explorer"] == counts["timm"] == family.params(dims), counts
    steps = {name: train_step(m.train(), device, bf16=cuda) for name, m in models.items()}

    x = torch.randn(args.batch, 3, dims["img_size"], dims["img_size"], device=device)
    y = torch.randint(0, dims["num_classes"], (args.batch,), device=device)
    for step in steps.values():  # warm up: allocator, kernels, autotuning
        for _ in range(3):
            step(x, y)
    names = list(steps)
    rounds: list[dict[str, float]] = [  # each model goes first in every other round
        {name: seconds_per_step(steps[name], x, y, args.steps, device) for name in names[:: 1 if i % 2 == 0 else -1]}
        for i in range(args.rounds)
    ]
    best = {name: min(r[name] for r in rounds) for name in steps}
    ratios = sorted(r["timm"] / r["explorer"] for r in rounds)

    dtype = torch.bfloat16 if cuda else torch.float32
    peak = matmul_flops(device, dtype, 8192 if cuda else 1024)
    train_flops = 3 * family.flops(dims)  # per sample: forward, and backward at twice the forward
    print(f"device {device} ({torch.cuda.get_device_name() if cuda else f'{torch.get_num_threads()} threads'}), "
          f"{'bf16 autocast' if cuda else 'fp32'}, batch {args.batch}, preset {args.preset}: "
          + ", ".join(f"{k}={dims[k]}" for k in ("layers", "heads", "width", "mlp", "img_size", "patch")))
    print(f"params {counts['explorer']:,}; train FLOPs/sample {train_flops / 1e9:.3f} G; "
          f"matmul peak {peak / 1e12:.2f} TFLOP/s ({dtype})")
    for name in steps:
        rate = args.batch / best[name]
        achieved = rate * train_flops
        print(f"{name:9s} {rate:10.1f} samples/s  {best[name] * 1e3:8.2f} ms/step  "
              f"{achieved / 1e12:7.3f} TFLOP/s  ({100 * achieved / peak:5.1f}% of matmul peak)")
    print(f"explorer / timm throughput: {best['timm'] / best['explorer']:.3f} (best rounds); "
          f"paired rounds median {ratios[len(ratios) // 2]:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
