"""How a step runs (explorer.steps): a CUDA graph replays exactly the eager steps, the ragged last batch gets
a graph of its own, compiling keeps the results, TF32 is set and recorded, and none of these speed settings
changes a study's identity. No GPU here: CUDA's capture and side stream are replaced by stand-ins that
replay the captured step on its static buffers, which is what a graph does.

What is bit for bit and what is not. A graphed step keeps AdamW's learning rate in a float32 tensor (a
graph cannot read a Python float that changes), so AdamW computes its step size lr / (1 - beta1^t) in
float32 where an eager step computes it in float64: the two paths round differently, and which way the
last bit falls depends on the processor's kernels (issue 36: equal on one CPU, 4e-8 apart on another). So
the graph is compared bit for bit with an eager run of the *same* optimizer (the same operations in the
same order on the same values, one thread: nothing a processor can reorder), and with the plain eager
run within float32 rounding: each step's update differs by about one float32 ulp (6e-8 relative), which
24 steps grow to at most ~1e-6 of a loss (`ROUNDING`, with a 10x margin); an eval image whose two largest
logits are that close may flip, so accuracy may move by one image.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

import pytest
import torch
from conftest import assert_within_rounding

from explorer import steps, train
from explorer.tasks import get_task
from explorer.train import Budget, TrialResult, run_trial

DIMS = dict(layers=1, heads=2, width=16, mlp=32, img_size=8, patch=4, in_chans=1, num_classes=10)
BUDGET = Budget(epochs=2, batch_size=128, lr=3e-3, grad_clip=0.5)  # 1437 train images: 11 full batches and one of 29
ROUNDING = 1e-5  # relative: float32 step sizes against float64 ones, over BUDGET's 24 steps (module docstring)
EVAL_IMAGES = 360  # digits' eval split


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def graphs_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """`cudagraphs` honoured on the CPU, with a capture that replays the step on the buffers it captured."""
    captured: list[tuple] = []

    def capture(step: Callable[..., None], static: Sequence[torch.Tensor]) -> Callable[[], None]:
        captured.append(tuple(tuple(t.shape) for t in static))
        return lambda: step(*static)

    monkeypatch.setattr(steps, "_cuda_capture", capture)
    monkeypatch.setattr(steps, "_cuda_side_stream", contextlib.nullcontext)
    monkeypatch.setattr(train, "compile_used", lambda mode, device: mode)
    return captured


def digits_trial(budget: Budget) -> TrialResult:
    return run_trial("image-encoder", DIMS, get_task("digits", {}), budget, device="cpu")


def eager_with_the_graphs_optimizer(monkeypatch: pytest.MonkeyPatch) -> TrialResult:
    """BUDGET run eagerly with the optimizer a graph gets (its learning rate in a float32 tensor)."""
    with monkeypatch.context() as patch:
        patch.setattr(train, "adamw", lambda *args, graphs=False: steps.adamw(*args, graphs=True))
        patch.setattr(train, "compile_used", lambda mode, device: "none")
        return digits_trial(BUDGET)


def test_graphed_steps_train_exactly_the_eager_steps(graphs_on_cpu: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    graphed = digits_trial(BUDGET.model_copy(update={"compile": "cudagraphs"}))
    same_optimizer = eager_with_the_graphs_optimizer(monkeypatch)
    assert graphed.compile == "cudagraphs" and same_optimizer.compile == "none"
    assert graphed.metrics == same_optimizer.metrics and graphed.curve == same_optimizer.curve
    assert graphed.steps == same_optimizer.steps
    # one graph for the full batch, a second for the ragged last one; captured once each, replayed after
    assert graphs_on_cpu == [((128, 1, 8, 8), (128,)), ((29, 1, 8, 8), (29,))]
    assert_within_rounding(graphed, digits_trial(BUDGET), ROUNDING, EVAL_IMAGES)  # the plain eager trial: float64 step sizes


def test_the_warm_up_before_a_capture_leaves_no_trace(graphs_on_cpu: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up steps train the model (and create AdamW's state): all of it is put back."""
    same_optimizer = eager_with_the_graphs_optimizer(monkeypatch)
    monkeypatch.setattr(steps, "WARMUP_STEPS", 7)
    assert digits_trial(BUDGET.model_copy(update={"compile": "cudagraphs"})).metrics == same_optimizer.metrics


def test_cudagraphs_on_the_cpu_runs_eagerly_and_says_so() -> None:
    result = digits_trial(BUDGET.model_copy(update={"compile": "cudagraphs", "max_steps": 2}))
    assert result.compile == "none"
    assert steps.compile_used("cudagraphs", "cuda:1") == "cudagraphs" and steps.compile_used("compile", "cpu") == "compile"


@pytest.mark.slow
def test_compiled_trial_matches_the_eager_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo and AOTAutograd as a compiled trial runs them (Inductor's code generation would cost minutes
    here: its kernels are bench/gpu.py's to time); the ragged batch and evaluation recompile, not fail."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    eager = digits_trial(BUDGET)
    compiled = digits_trial(BUDGET.model_copy(update={"compile": "compile"}))
    assert compiled.compile == "compile"
    assert compiled.curve == pytest.approx(eager.curve, abs=1e-6)
    assert compiled.metrics == pytest.approx(eager.metrics, rel=1e-5)


def test_tf32_is_set_explicitly_for_each_trial_and_recorded() -> None:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        on = digits_trial(BUDGET.model_copy(update={"tf32": True, "max_steps": 1}))
        assert on.tf32 and torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        off = digits_trial(BUDGET.model_copy(update={"max_steps": 1}))
        assert not off.tf32 and not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_speed_settings_leave_the_identity_and_tf32_enters_it_when_on() -> None:
    """A study stored before these fields existed keeps its identity; TF32 changes what is measured."""
    old_fields = {"epochs", "max_steps", "time_limit_s", "batch_size", "lr", "weight_decay", "warmup_frac",
                  "grad_clip", "bf16", "seed"}
    assert set(Budget().identity()) == old_fields
    assert Budget(compile="cudagraphs", seed_batch="off").identity() == Budget().identity()
    assert Budget(tf32=True).identity() == {**Budget().identity(), "tf32": True}
    with pytest.raises(ValueError, match="compile"):
        Budget(compile="graphs")


def test_a_study_asking_for_speed_keeps_the_identity_of_one_that_does_not(tmp_path) -> None:
    from conftest import tiny_study_doc, write_study

    from explorer.study import load_study_spec

    plain = load_study_spec(write_study(tmp_path / "a"))
    budget = {**tiny_study_doc()["budget"], "compile": "cudagraphs", "seed_batch": "on"}
    fast = load_study_spec(write_study(tmp_path / "b", budget=budget))
    assert fast.identity_key == plain.identity_key
    assert load_study_spec(write_study(tmp_path / "c", budget={**budget, "tf32": True})).identity_key != plain.identity_key
