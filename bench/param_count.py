"""How many configurations per second the parameter counters evaluate, against building the models.

explorer's own families count in closed form; the benchmark builds the same models on the meta device
(shapes only, no memory) and counts `numel`, side by side in one run, and checks the counts agree.
timm families always count by a meta-device build; for them it compares a fresh build with the counts
read back from the disk cache (as a new process does) and with a repeated call (memory).

    python bench/param_count.py
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable

import torch

from explorer.families import get_family
from explorer.families import timm_adapters
from explorer.families._disk_cache import DiskCounts


def own_configs() -> list[tuple[str, dict]]:
    """48 configurations of explorer's own families, from 1 layer at width 64 to 24 layers at 1024."""
    out = []
    for layers, width in itertools.product([1, 6, 12, 24], [64, 256, 512, 1024]):
        heads, mlp = width // 64, 4 * width
        out.append(("image-encoder", dict(layers=layers, heads=heads, width=width, mlp=mlp, img_size=224, patch=16, num_classes=1000)))
        out.append(("causal-lm", dict(layers=layers, heads=heads, width=width, mlp=mlp, vocab=50304, seq_len=1024, tie_weights=False)))
        out.append(("crammed-bert", dict(layers=layers, heads=heads, width=width, mlp=mlp)))
    return [(f, {**get_family(f).defaults(), **d}) for f, d in out]


TIMM_CONFIGS = [
    ("timm-vit", dict(layers=12, heads=6)),
    ("timm-xcit", dict(layers=16, heads=8)),
    ("timm-xcit", dict(model="xcit_large_24_p16_224", layers=12, heads=16)),
    ("timm-davit", dict(layers=5, heads=4)),
    ("timm-tnt", dict(layers=6, heads=10)),
]


def meta_count(family: str, dims: dict) -> int:
    with torch.device("meta"):
        model = get_family(family).build(dims)
    return sum(p.numel() for p in model.parameters())


def rate(fn: Callable[[], None], n_configs: int, min_seconds: float = 0.5) -> float:
    """Configurations per second of `fn` (one pass over `n_configs` configurations), repeated for `min_seconds`."""
    passes, start = 0, time.perf_counter()
    while passes == 0 or time.perf_counter() - start < min_seconds:
        fn()
        passes += 1
    return passes * n_configs / (time.perf_counter() - start)


def main() -> None:
    torch.set_num_threads(1)
    own = own_configs()
    for family, dims in own:
        assert get_family(family).params(dims) == meta_count(family, dims), (family, dims)
    closed = rate(lambda: [get_family(f).params(d) for f, d in own], len(own))
    meta = rate(lambda: [meta_count(f, d) for f, d in own], len(own), min_seconds=0.0)
    print(f"explorer families ({len(own)} configs, {sorted({f for f, _ in own})}):")
    print(f"  counting closed-form          {closed:12,.0f} configs/s")
    print(f"  building on the meta device   {meta:12,.1f} configs/s")
    print(f"  ratio closed-form / meta      {closed / meta:12,.0f}x  (counts identical)")

    fams = sorted({f for f, _ in TIMM_CONFIGS})
    count_timm = lambda: [get_family(f).params(d) for f, d in TIMM_CONFIGS]  # noqa: E731
    with tempfile.TemporaryDirectory() as cache:
        os.environ["XDG_CACHE_HOME"] = cache  # an empty disk cache: the first call builds
        fresh = rate(count_timm, len(TIMM_CONFIGS), min_seconds=0.0)
        cached = rate(count_timm, len(TIMM_CONFIGS))
        timm_adapters._COUNTS = DiskCounts()  # what a new process sees: the counts on disk only
        disk = rate(count_timm, len(TIMM_CONFIGS), min_seconds=0.0)
    print(f"timm families ({len(TIMM_CONFIGS)} configs, {fams}): counting meta-device (cached in memory and on disk)")
    print(f"  first call: meta-device build {fresh:12,.1f} configs/s")
    print(f"  new process: disk cache read  {disk:12,.0f} configs/s")
    print(f"  repeated call: memory hit     {cached:12,.0f} configs/s")
    print(f"  ratio disk / build            {disk / fresh:12,.0f}x")
    print(f"  ratio memory / build          {cached / fresh:12,.0f}x")


if __name__ == "__main__":
    main()
