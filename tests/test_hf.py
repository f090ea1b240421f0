"""transformers families: counts and FLOPs against the built models, κ on every attention block
whichever backend, training on each family's task, the shipped spaces and a study through storage."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import optuna
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="the hf extra is not installed (pip install -e '.[hf]')")

from explorer.cli import app  # noqa: E402
from explorer.conditioning import attention_condition, attention_modules, condition_number  # noqa: E402
from explorer.errors import ExplorerError  # noqa: E402
from explorer.executors.local import LocalExecutor  # noqa: E402
from explorer.families import get_family  # noqa: E402
from explorer.space import load_space  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402
from explorer.tasks import get_task  # noqa: E402
from explorer.train import Budget, run_trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HF = ["hf-gpt2", "hf-bert", "hf-llama"]
COMPLETE = optuna.trial.TrialState.COMPLETE


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@st.composite
def hf_dims(draw: st.DrawFn, family: str) -> dict:
    """Small random dims, every field set; eager attention, whose matmuls FlopCounterMode sees on CPU."""
    heads = draw(st.sampled_from([1, 2, 4]))
    dims = dict(
        layers=draw(st.integers(1, 3)),
        heads=heads,
        width=heads * draw(st.sampled_from([2, 4, 8])),
        mlp=draw(st.integers(1, 24)),
        vocab=draw(st.integers(2, 40)),
        seq_len=draw(st.integers(1, 12)),
        attn="eager",
    )
    if family == "hf-bert":
        dims["num_classes"] = draw(st.integers(1, 5))
    else:
        dims["tie_weights"] = draw(st.booleans())
    if family == "hf-llama":
        dims["kv_heads"] = draw(st.sampled_from(["heads", *(k for k in (1, 2, 4) if heads % k == 0)]))
    return dims


def ids(dims: dict, batch: int = 1) -> torch.Tensor:
    """Token ids without padding (id 0 is BERT's padding)."""
    return torch.randint(1, dims["vocab"], (batch, dims["seq_len"])) if dims["vocab"] > 1 else torch.ones(batch, dims["seq_len"], dtype=torch.long)


@pytest.mark.parametrize("family", HF)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_closed_form_counts_and_flops_equal_the_built_model(family: str, data: st.DataObject) -> None:
    fam = get_family(family)
    dims = data.draw(hf_dims(family))
    model = fam.build(dims)
    assert fam.params(dims) == sum(p.numel() for p in model.parameters())  # tied embeddings once
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids(dims))
    # transformers < 5 computes Llama's rotary angles (head_dim/2 x seq_len) as a matmul, 5 does not
    rotary = dims["width"] // dims["heads"] * dims["seq_len"] if family == "hf-llama" else 0
    assert counter.get_total_flops() - fam.flops(dims) in {0, rotary} and fam.flops(dims) > 0
    assert len(attention_modules(model)) == dims["layers"]


@pytest.mark.parametrize(
    ("family", "dims", "count"),
    [
        ("hf-gpt2", {}, 124_439_808),  # GPT-2 small, tied head
        ("hf-gpt2", {"tie_weights": False}, 124_439_808 + 50257 * 768),
        ("hf-bert", {}, 109_483_778),  # BERT-base with a two-class head
        ("hf-llama", {}, 6_738_415_616),  # Llama-2-7B
        ("hf-llama", {"kv_heads": 8}, 6_738_415_616 - 32 * 2 * 4096 * (4096 - 8 * 128)),
    ],
)
def test_transformers_own_configurations_count_as_transformers_builds_them(family: str, dims: dict, count: int) -> None:
    fam = get_family(family)
    with torch.device("meta"):
        model = fam.build(dims)
    assert fam.params(dims) == sum(p.numel() for p in model.parameters()) == count


def test_params_command_prints_gpt2_small_on_the_shipped_space() -> None:
    result = CliRunner().invoke(app, ["params", str(ROOT / "spaces/hf/gpt2-small.yaml"), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {(r["layers"], r["heads"]): r for r in json.loads(result.output)}
    assert rows[12, 12]["params"] == 124_439_808 and rows[12, 12]["baseline"] == "*"
    assert {h for _, h in rows} == {6, 12, 24} and rows[12, 6]["params"] == rows[12, 24]["params"]


SMALL = {
    "hf-gpt2": dict(layers=2, heads=4, width=32, mlp=64, vocab=50, seq_len=12),
    "hf-bert": dict(layers=2, heads=4, width=32, mlp=64, vocab=50, seq_len=12, num_classes=3),
    "hf-llama": dict(layers=2, heads=4, kv_heads=2, width=32, mlp=64, vocab=50, seq_len=12),
}


@pytest.mark.parametrize("family", HF)
def test_kappa_is_the_same_with_eager_and_sdpa_attention(family: str) -> None:
    """κ reads the output projection's input: the heads' outputs, whichever kernel computed them."""
    x = ids(SMALL[family], batch=6)
    if family == "hf-bert":
        x[:, -3:] = 0  # padding: both backends must mask it alike
    kappas = {}
    for attn in ("eager", "sdpa"):
        torch.manual_seed(0)
        blocks = attention_condition(get_family(family).build({**SMALL[family], "attn": attn}), x)
        kappas[attn] = [b["kappa"] for b in blocks]
    assert len(kappas["sdpa"]) == SMALL[family]["layers"]
    assert all(math.isfinite(k) and k >= 1 for k in kappas["sdpa"])
    assert kappas["eager"] == pytest.approx(kappas["sdpa"], rel=1e-3)


def test_kv_heads_fixed_tied_or_free_in_a_space(tmp_path: Path) -> None:
    doc = (ROOT / "spaces/hf/tinystories-llama.yaml").read_text()
    free = load_space(ROOT / "spaces/hf/tinystories-llama.yaml")
    assert {(c["heads"], c["kv_heads"]) for c in free.configs()} == {(h, k) for h in (2, 4, 8) for k in (1, 2)}
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(doc.replace("  kv_heads: [1, 2]\n", "").replace("tie_weights: true}", "tie_weights: true, kv_heads: 4}")
                     .replace("baseline: {layers: 4, heads: 4, kv_heads: 2}", "baseline: {layers: 4, heads: 4}"))
    with pytest.raises(ExplorerError, match="free.heads") as listed:  # a listed value no configuration can take
        load_space(fixed)
    assert "2" in str(listed.value)  # 2 query heads cannot share 4 key/value heads: said, not dropped
    fixed.write_text(fixed.read_text().replace("heads: [2, 4, 8]", "heads: [4, 8]"))
    space = load_space(fixed)
    assert {c["heads"] for c in space.configs()} == {4, 8}
    assert "kv_heads 4 must divide heads 2" in " ".join(space.explain({**space.configs()[0].dims, "heads": 2}))
    tied = tmp_path / "tied.yaml"
    tied.write_text(fixed.read_text().replace("kv_heads: 4}", "kv_heads: heads}").replace("heads: [4, 8]", "heads: [2, 4, 8]"))
    configs = load_space(tied).configs()
    assert len(configs) == 9 and all(c["kv_heads"] == "heads" for c in configs)
    mha = next(c for c in configs if c["heads"] == 4 and c["layers"] == 1)
    gqa = next(c for c in free.configs() if c["heads"] == 4 and c["kv_heads"] == 2 and c["layers"] == 1)
    assert mha.params - gqa.params == 2 * 128 * 64  # k and v: 4 heads of 32 channels instead of 2


def tiny_stories(path: Path, sentences: int = 400) -> Path:
    """A TinyStories-style text file: short sentences from a small grammar, seeded."""
    rng = random.Random(0)
    names, things = ["Lily", "Tom", "Sam", "Mia"], ["ball", "cat", "tree", "boat", "cake"]
    verbs, feelings = ["saw", "liked", "found", "lost"], ["happy", "sad", "tired"]
    lines = [f"{rng.choice(names)} {rng.choice(verbs)} a {rng.choice(things)}. {rng.choice(names)} was {rng.choice(feelings)}."
             for _ in range(sentences)]
    path.write_text("Once upon a time. " + " ".join(lines) + "\n")
    return path


def reviews(path: Path, rows: int = 256) -> Path:
    """A TSV for text classification: the label says whether the line ends 'good' or 'bad'."""
    rng = random.Random(0)
    lines = [f"{rng.choice(['the', 'a'])} {rng.choice(['film', 'plot', 'song'])} was {w}\t{w}"
             for w in rng.choices(["good", "bad"], k=rows)]
    path.write_text("text\tlabel\n" + "\n".join(lines) + "\n")
    return path


TASKS = {
    "text-file": lambda tmp: get_task("text-file", {"path": tiny_stories(tmp / "t.txt"), "seq_len": 12}),
    "listops": lambda tmp: get_task("listops", {"n_train": 256, "n_eval": 64, "max_length": 12, "min_length": 2, "max_depth": 2}),
    "text-classification": lambda tmp: get_task("text-classification", {"path": reviews(tmp / "r.tsv"), "seq_len": 12}),
}


@pytest.mark.parametrize(("family", "task_name"), [("hf-gpt2", "text-file"), ("hf-llama", "text-file"), ("hf-bert", "listops"),
                                                   ("hf-bert", "text-classification")])
def test_each_family_trains_on_its_task(family: str, task_name: str, tmp_path: Path) -> None:
    task = TASKS[task_name](tmp_path)
    dims = {**SMALL[family], **task.dims()}
    reports: list[dict[str, float]] = []
    budget = Budget(epochs=3, batch_size=32, lr=3e-3, warmup_frac=0.0, seed=0)
    result = run_trial(family, dims, task, budget, callback=lambda e, m: reports.append(m), device="cpu")
    losses = [m["train_loss"] for m in reports]
    assert losses[-1] < losses[0] and reports[-1]["eval_loss"] < reports[0]["eval_loss"]
    assert result.params == get_family(family).params(dims)
    for blocks in (result.kappa_init, result.kappa_final):
        assert len(blocks) == dims["layers"] and all(b["kappa"] >= 1 for b in blocks)


def shipped_study(name: str, tmp_path: Path) -> Path:
    """The shipped study and its space copied under tmp_path, with a generated text file beside it."""
    shutil.copytree(ROOT / "spaces", tmp_path / "spaces")
    (tmp_path / "studies/hf").mkdir(parents=True)
    shutil.copy(ROOT / f"studies/hf/{name}.yaml", tmp_path / f"studies/hf/{name}.yaml")
    tiny_stories(tmp_path / "studies/hf/tinystories.txt", sentences=2000)
    return tmp_path / f"studies/hf/{name}.yaml"


@pytest.mark.parametrize("name", ["tinystories-gpt2", "tinystories-llama"])
def test_shipped_study_runs_two_trials_through_storage(name: str, tmp_path: Path) -> None:
    study = load_study_spec(shipped_study(name, tmp_path))
    assert len(study.keys) == (12 if "gpt2" in name else 18) and study.spec.n_trials == 12
    study.spec.n_trials, study.spec.budget.max_steps, study.spec.budget.batch_size = 2, 3, 8
    LocalExecutor().run(study, study.open())
    reloaded = optuna.load_study(study_name=study.spec.name, storage=study.store.url)  # from the SQLite file
    trials = reloaded.get_trials(states=(COMPLETE,))
    assert len(trials) == 2 and len({t.params["arch"] for t in trials}) == 2
    for trial in trials:
        cfg = study.configs[trial.params["arch"]]
        assert trial.user_attrs["params"] == cfg.params and trial.user_attrs["steps"] == 3
        assert len(trial.user_attrs["kappa_init"]) == cfg["layers"] and math.isfinite(trial.values[0])


class Interrupt(Exception):
    pass


def test_tied_gpt2_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path: Path) -> None:
    """The tied head is one tensor under two state-dict names: a resumed run keeps it tied and exact."""
    task = get_task("text-file", {"path": tiny_stories(tmp_path / "t.txt", sentences=60), "seq_len": 12})
    dims = {**SMALL["hf-gpt2"], **task.dims()}
    budget = Budget(epochs=3, batch_size=32, lr=3e-3, seed=0)
    whole = run_trial("hf-gpt2", dims, task, budget, device="cpu")

    def die_after_epoch_0(epoch: int, metrics: dict[str, float]) -> None:
        raise Interrupt

    with pytest.raises(Interrupt):
        run_trial("hf-gpt2", dims, task, budget, die_after_epoch_0, checkpoint_dir=tmp_path / "ckpt", device="cpu")
    epochs: list[int] = []
    resumed = run_trial("hf-gpt2", dims, task, budget, lambda e, m: epochs.append(e), checkpoint_dir=tmp_path / "ckpt", device="cpu")
    assert epochs == [1, 2] and whole.steps > 3
    assert resumed.steps == whole.steps and resumed.curve == whole.curve and resumed.kappa_final == whole.kappa_final


def heads_output(family: str, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The first block's concatenated head outputs, recovered without the κ hook: BERT's self-attention
    returns them; GPT-2's and Llama's attention return them projected, so the projection is inverted."""
    net, outputs = model.net, []
    module = {"hf-gpt2": lambda: net.transformer.h[0].attn, "hf-bert": lambda: net.bert.encoder.layer[0].attention.self,
              "hf-llama": lambda: net.model.layers[0].self_attn}[family]()
    handle = module.register_forward_hook(lambda m, i, out: outputs.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        model(x)
    handle.remove()
    if family == "hf-gpt2":  # Conv1D: out = a @ W + b
        return (outputs[0] - module.c_proj.bias) @ torch.linalg.pinv(module.c_proj.weight)
    if family == "hf-llama":  # Linear without bias: out = a @ W.T
        return outputs[0] @ torch.linalg.pinv(module.o_proj.weight).T
    return outputs[0]


@pytest.mark.parametrize("family", HF)
def test_kappa_reads_the_concatenated_heads_of_every_block_and_leaves_the_model_as_it_was(family: str) -> None:
    torch.manual_seed(0)
    model = get_family(family).build({**SMALL[family], "attn": "eager"}).double().train()
    x = ids(SMALL[family], batch=8)
    kappas = [b["kappa"] for b in attention_condition(model, x)]
    assert len(kappas) == SMALL[family]["layers"] and model.training
    assert all(not m.proj._forward_pre_hooks for _, m in attention_modules(model))
    assert "proj" not in dict(model.named_modules()) and not any(".proj." in k for k in model.state_dict())  # an alias only
    model.eval()
    assert kappas[0] == pytest.approx(condition_number(heads_output(family, model, x)), rel=1e-6)
