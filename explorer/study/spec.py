"""What a study is: its YAML (`StudySpec`, field for field) resolved against its files (`ResolvedStudy`),
and the identity that says which question its stored trials answer.

This module reads files and builds objects; it never opens a storage nor trains, and imports none of the
jobs done on a study (storage.py, queue.py, evaluate.py and read.py do them, each handed a `ResolvedStudy`;
root.py composes them into `Study`).
"""

from __future__ import annotations

import difflib
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Self

import optuna
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from explorer import checkpoints
from explorer.budget import Budget
from explorer.errors import ExplorerError
from explorer.identity import identity_key
from explorer.pruning import BinnedPruner, bin_edges
from explorer.decisions import DecisionSpec
from explorer.replicates import ReplicateSpec
from explorer.sampling import BudgetSampler, Encoding, FeasibleSampler, encoding_of
from explorer.space import Config, SearchSpace, SpaceSpec, load_space
from explorer.tasks import Task, get_task
from explorer.tracking.spec import TrackingSpec

OBJECTIVE_NAMES = ("params", "flops", "train_time_s")  # besides the task's metrics
STORAGE_FORMS = "sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB, grpc://HOST:PORT or journal:PATH"
_SCHEMES = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql", "grpc")  # SQLAlchemy's dialects, Optuna's proxy
_OBJECTIVE = re.compile(r"^(maximize|minimize)\s+(\w+)$")


class Objective(BaseModel):
    """One objective, written `maximize NAME` or `minimize NAME` (or as this mapping)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    direction: Literal["maximize", "minimize"] = Field(description="whether more is better")
    name: str = Field(description="the task's metric (e.g. `accuracy`, `eval_loss`, `perplexity`), `params`, `flops` "
                                  "or `train_time_s`")


class SamplerSpec(BaseModel):
    """Which sampler proposes configurations (explorer.sampling): `budget-ei` (explorer's own, the
    default: it won bench/search.py), Optuna's `tpe`, `gp`, `nsga2`, `random`, or `grid` (every one)."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["budget-ei", "tpe", "gp", "nsga2", "random", "grid"] = Field("budget-ei", description="the sampler")
    seed: int = Field(0, description="the sampler's seed")
    population_size: int = Field(8, ge=2, description="`nsga2` only: its population per generation")


class PrunerSpec(BaseModel):
    """Pruning on the per-epoch metric, fair to small models (see explorer.pruning): `dominated` stops a
    trial that, even with the largest gain its bin's complete trials made from this epoch on, would
    finish more than `margin` below a configuration with no more parameters; `median` and
    `successive-halving` compare within `param_bins` parameter bins. Replicates and verification
    trials are never pruned: their configuration is measured on purpose."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["none", "dominated", "median", "successive-halving"] = Field("none", description="the pruning rule")
    warmup_epochs: int = Field(1, ge=1, description="epochs a trial trains before it can be pruned")
    startup_trials: int = Field(4, ge=1, description="complete trials needed before any trial is pruned")
    reduction_factor: int = Field(2, ge=2, description="`successive-halving` only: how fast its rungs thin out")
    param_bins: int = Field(3, ge=1, description="`median` and `successive-halving`: quantile bins of the space's "
                                                 "parameter counts; a trial is compared within its bin")
    margin: float = Field(0.0, ge=0, description="`dominated` only, in the metric's units: how far below a cheaper "
                                                 "configuration a trial must be bound to finish")
    noise: float | None = Field(None, ge=0, description="`dominated` only: a run's sd of the final metric; "
                                                        "null: the study's own noise model")


class ExecutorSpec(BaseModel):
    """Where trials run: `local` (in this process) or `ray` (Ray Tune; `address` joins a cluster).

    `device`: `auto` trains on GPUs where there are any (this machine's, or the Ray cluster's), `cpu` or
    `cuda` (an error where there is none: never a silent CPU run); explorer.executors.devices resolves it.
    `cpu` and `gpu` are the resources of one trial (torch's CPU threads, locally); `gpu` defaults to one
    GPU per trial on a GPU device and 0 on a CPU, and a fraction (0.5: two trials per GPU) is an explicit
    choice. `n_jobs` trials train at once in a local executor's process (threads, as Optuna's
    `optimize(n_jobs=...)`; default: as many as the GPUs' slots, one on a CPU); `max_concurrent` trials
    at once on Ray (default: as many as the cluster can run at once); `max_failures` retries of a trial
    whose worker died or hit a fault (explorer.faults); `checkpoint_every_s`: a trial's checkpoint is
    written after an epoch once this long passed since the last (0: every epoch; on Ray each is uploaded
    to `storage_path`); `address` and `storage_path` (where Ray Tune keeps trial checkpoints: a folder
    every node shares, or a URI such as s3://bucket/path) are Ray's.
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal["local", "ray"] = Field("local", description="`local`: in this process; `ray`: Ray Tune")
    address: str | None = Field(None, description="Ray: the cluster to join (`auto`, or the head's host:port); "
                                                  "null: a local Ray")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="what trials train on: GPUs where there "
                                                                       "are any (`auto`), `cpu`, or `cuda` (an error without one)")
    cpu: float = Field(1, gt=0, description="CPUs of one trial (torch's CPU threads, locally)")
    gpu: float | None = Field(None, ge=0, description="GPUs of one trial (0.5: two trials a GPU); null: 1 on a "
                                                      "GPU device, 0 on a CPU")
    n_jobs: int | None = Field(None, ge=1, description="local: trials at once, in threads; null: one per GPU "
                                                       "slot, one on a CPU")
    max_concurrent: int | None = Field(None, ge=1, description="Ray: trials at once; null: as many as the cluster holds")
    max_failures: int = Field(2, ge=0, description="retries of a trial whose worker died or hit a fault")
    checkpoint_every_s: float = Field(30, ge=0, description="seconds between a trial's checkpoints, written after an "
                                                            "epoch (0: every epoch)")
    storage_path: str | None = Field(None, description="Ray: where Ray Tune keeps trial checkpoints, a folder every "
                                                       "node mounts or a URI (s3://...); null: `NAME.ray/` beside the study")


class StudySpec(BaseModel):
    """The YAML of a study, field for field."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the study's name in its storage")
    space: str = Field(description="the space YAML, relative to this file")
    task: dict[str, Any] = Field(description="`name:` of the task and its options (see the tasks reference)")
    budget: Budget = Field(Budget(), description="how long and how one trial trains")
    replicates: ReplicateSpec = Field(ReplicateSpec(), description="how `budget.seeds` are spent")
    decision: DecisionSpec = Field(DecisionSpec(), description="what counts as decided, at which budgets")
    objectives: list[Objective] | None = Field(None, description="e.g. `[maximize accuracy, minimize params]`; "
                                                                 "null: the task's metric and parameters")
    sampler: SamplerSpec = Field(SamplerSpec(), description="what proposes configurations")
    pruner: PrunerSpec = Field(PrunerSpec(), description="what stops hopeless trials early")
    n_trials: int = Field(ge=1, description="distinct configurations to measure; replicate seeds come on top")
    max_failures: int | None = Field(None, ge=1, description="the study stops after this many trials failed by "
                                                             "themselves; null: no limit")
    storage: str | None = Field(None, description="an Optuna storage URL (`sqlite:///x.db`, `postgresql://...`) or "
                                                  "`journal:PATH`; null: `sqlite:///NAME.db` beside this file")
    storage_timeout_s: float = Field(60, gt=0, description="how long a worker waits for a locked SQLite file or the study's lock")
    heartbeat_s: int = Field(5, ge=1, description="seconds between a running trial's heartbeats; a trial silent "
                                                  "for 3 of them is failed and queued again")
    trial_timeout_s: float | None = Field(None, gt=0, description="wall-clock limit of one trial, past which it "
                                                                  "fails (explorer.watchdog); null: none")
    executor: ExecutorSpec = Field(ExecutorSpec(), description="where trials run")
    tracking: TrackingSpec = Field(TrackingSpec(), description="trackers that receive the trials (MLflow, TensorBoard: "
                                                               "explorer.tracking); none by default")

    @model_validator(mode="before")
    @classmethod
    def _a_study(cls, data: Any) -> Any:
        """A space YAML where a study is expected is said to be one, not a study with unknown fields."""
        if isinstance(data, dict) and "task" not in data and {"family", "free"} & set(data):
            raise ValueError("this is a space YAML (it names a family and its free dimensions), where a study YAML is "
                             "expected (a space, a task and n_trials, as in studies/: a study names this file in `space:`)")
        return data

    @field_validator("objectives", mode="before")
    @classmethod
    def _objectives(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        out = []
        for item in value:
            if isinstance(item, str):
                match = _OBJECTIVE.match(item.strip())
                if not match:
                    raise ValueError(f"{item!r}: write 'maximize NAME' or 'minimize NAME'")
                item = {"direction": match.group(1), "name": match.group(2)}
            out.append(item)
        if not out:
            raise ValueError("at least one objective")
        return out

    @field_validator("storage")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        return value if value is None else storage_url(value)

    @field_validator("task")
    @classmethod
    def _task_named(cls, value: dict) -> dict:
        if not isinstance(value.get("name"), str):
            raise ValueError("the task needs a name (e.g. digits, listops, image-folder, text-file)")
        return value


def storage_url(url: str) -> str:
    """`url` if it names a storage explorer opens (an SQLAlchemy URL of a known dialect, grpc://, journal:), else
    a ValueError that says what one looks like, with the likeliest meant: `studies/x.db` or `sqlit:///x.db` is
    `sqlite:///x.db`, `sqlite://x.db` (two slashes) too."""
    if url.startswith("journal:"):
        return url
    scheme, sep, rest = url.partition("://")
    dialect = scheme.split("+")[0].lower()
    if sep and dialect in _SCHEMES and not (dialect == "sqlite" and rest and not rest.startswith("/")):
        return url
    if not sep:
        meant = f"sqlite:///{url.removeprefix('sqlite:')}" if re.search(r"\.(db|sqlite3?)$|/", url) else None
    elif dialect == "sqlite":
        meant = f"sqlite:///{rest}"
    else:
        close = difflib.get_close_matches(dialect, _SCHEMES, n=1)
        meant = (f"sqlite:///{rest.lstrip('/')}" if close[0] == "sqlite" else f"{close[0]}://{rest}") if close else None
    hint = f" (did you mean {_masked(meant)}?)" if meant else ""
    raise ValueError(f"{_masked(url)!r} is not a storage URL: write {STORAGE_FORMS}{hint}")


def _masked(url: str) -> str:
    """A URL with its password (`user:password@`) masked, fit for an error message."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


class ResolvedStudy:
    """A study spec resolved against its files (space, task, objectives), and what follows from it alone:
    paths, identity, configurations, seeds, sampler, pruner. Data for the jobs done on it (root.py's
    `Study` adds them), which each import this module and never the other way round.
    """

    def __init__(self, spec: StudySpec, source: Path, space: SearchSpace | None = None):
        self.spec = spec
        self.source = source
        self.flags: dict[str, str] = {}  # executor fields the command line set, by its flag (`device`: `--device`): errors name it
        self.space: SearchSpace = space or load_space(self.path(spec.space, "space"))
        options = {k: v for k, v in spec.task.items() if k != "name"}
        for key in ("root", "path"):
            if isinstance(options.get(key), str):
                options[key] = str(self.path(options[key], f"task.{key}", must_exist=False))
        self.task: Task = get_task(spec.task["name"], options, source=str(source))
        self.objectives: list[Objective] = spec.objectives or self._default_objectives()
        self._check_objectives()
        self._check_task_fits_space()

    def to_data(self) -> dict[str, Any]:
        """The resolved study as plain data, for machines that do not have its files (Ray worker nodes)."""
        return {"spec": self.spec.model_dump(mode="json"), "source": str(self.source.resolve()),
                "space": self.space.to_dict(), "space_source": self.space.source}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Self:
        """The study `to_data` described, rebuilt without reading its YAML files; relative paths in it
        (task data, storage) still resolve against the original study's folder."""
        space = SearchSpace(SpaceSpec.model_validate(data["space"]), data["space_source"])
        return cls(StudySpec.model_validate(data["spec"]), Path(data["source"]), space)

    # -- resolution and validation --------------------------------------------------------------
    def path(self, value: str, field: str, must_exist: bool = True) -> Path:
        """A path in the spec is relative to the spec's folder; say so when it is missing."""
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = self.source.parent / path
        if must_exist and not path.exists():
            raise ExplorerError(f"{path} does not exist", source=str(self.source), field=field)
        if must_exist and not path.is_file():
            raise ExplorerError(f"{path} is not a file", source=str(self.source), field=field)
        return path

    def _default_objectives(self) -> list[Objective]:
        metric = Objective(direction="maximize" if self.task.higher_is_better else "minimize", name=self.task.metric)
        return [metric, Objective(direction="minimize", name="params")]

    def _check_objectives(self) -> None:
        known = {*OBJECTIVE_NAMES, self.task.metric}
        for i, obj in enumerate(self.objectives):
            if obj.name not in known:
                raise ExplorerError(f"unknown objective {obj.name!r}; this task offers {', '.join(sorted(known))}",
                                    source=str(self.source), field=f"objectives.{i}")
        if self.task.metric not in {o.name for o in self.objectives}:
            raise ExplorerError(f"no objective uses the task's metric {self.task.metric!r}", source=str(self.source), field="objectives")

    def _check_task_fits_space(self) -> None:
        sample = self.space.configs()[0].dims
        for key, value in self.task.dims().items():
            if key in sample and sample[key] != value:
                raise ExplorerError(f"task {self.task.name} gives {key}={value} but space {self.space.name} has {key}={sample[key]}",
                                    source=str(self.source), field="task")

    @property
    def checkpoint_root(self) -> Path:
        return self.source.parent / f"{self.spec.name}.ckpt"

    def checkpoint_dir(self, cfg: Config, lineage: int) -> Path:
        """Where the trial `lineage` (and its retries) keeps its checkpoint (explorer.checkpoints)."""
        return checkpoints.folder(self.checkpoint_root, cfg.key, lineage)

    lineage = staticmethod(checkpoints.lineage)

    def identity(self) -> dict[str, Any]:
        """What defines the question a study answers: changing it mid-study is refused."""
        return {
            "space": self.space.fingerprint,
            "task": {k: v for k, v in self.spec.task.items()},
            "budget": self.spec.budget.identity(),
            "objectives": [f"{o.direction} {o.name}" for o in self.objectives],
        }

    @property
    def identity_key(self) -> str:
        """The identity's short name, stored on every trial (explorer.identity)."""
        return identity_key(self.identity())

    # -- what the spec builds ------------------------------------------------------------------
    @cached_property
    def configs(self) -> dict[str, Config]:
        return {cfg.key: cfg for cfg in self.space.configs()}

    @property
    def keys(self) -> list[str]:
        return list(self.configs)

    @property
    def seeds(self) -> list[int]:
        return self.spec.budget.seed_list

    @property
    def seed_cap(self) -> int:
        """Seeds a configuration may get: budget.seeds, or decision.max_seeds where fewer."""
        return min(len(self.seeds), self.spec.decision.max_seeds or len(self.seeds))

    def seed_of(self, trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
        """The seed a trial trains with: a queued replicate's own, else the first (every configuration starts there)."""
        return int(trial.user_attrs.get("seed", self._first_seed))

    @cached_property
    def _first_seed(self) -> int:
        return self.seeds[0]

    @property
    def target_epochs(self) -> int:
        """The length the answers are for: `decision.epochs`, else the longest the study trains."""
        return self.spec.decision.epochs or self.spec.budget.longest

    @property
    def entry_epochs(self) -> int:
        """The length a configuration is first measured at: the shortest rung where the `decide` policy buys
        longer runs of the contenders, else the longest (under wsd it gives every shorter rung too)."""
        ladder = self.spec.budget.ladder
        return ladder[0] if self.spec.replicates.policy == "decide" else ladder[-1]

    def length_of(self, trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
        """The length (epochs) a trial trains: a queued run's own, else the entry length."""
        return int(trial.user_attrs.get("epochs", self.entry_epochs))

    def encoding(self, study: optuna.Study | None = None) -> Encoding:
        """How this study's configurations are Optuna parameters: ordered, or `arch` for a study stored
        before the ordered encoding (chosen once per opened study, from its stored trials)."""
        if study is not None or not hasattr(self, "_encoding"):
            self._encoding = encoding_of(self.space, study)
        return self._encoding

    def sampler(self, study: optuna.Study | None = None) -> optuna.samplers.BaseSampler:
        """The spec's sampler over `study`'s encoding; every proposal is a feasible configuration no
        trial has taken (explorer.sampling). TPE runs with a constant liar for parallel workers."""
        s, enc = self.spec.sampler, self.encoding(study)
        if s.name == "budget-ei":
            metric = [o.name for o in self.objectives].index(self.task.metric)
            return BudgetSampler(enc, metric, self.objectives[metric].direction == "maximize", seed=s.seed)
        inner = {
            "tpe": lambda: optuna.samplers.TPESampler(seed=s.seed, multivariate=True, constant_liar=True),
            "gp": lambda: optuna.samplers.GPSampler(seed=s.seed),
            "nsga2": lambda: optuna.samplers.NSGAIISampler(population_size=s.population_size, seed=s.seed),
        }.get(s.name, lambda: optuna.samplers.RandomSampler(seed=s.seed))()  # grid: the queue decides; random fills
        return FeasibleSampler(enc, inner, seed=s.seed)

    def budgets(self) -> list[int]:
        """The parameter budgets the study answers (`decision.budgets`, default log-spaced over the space)."""
        base = self.space.baseline
        return self.spec.decision.budget_list([c.params for c in self.configs.values()], base.params if base else None)

    @cached_property
    def pruner(self) -> BinnedPruner:
        p = self.spec.pruner
        edges = bin_edges([cfg.params for cfg in self.space.configs()], p.param_bins)
        return BinnedPruner(p.name, self.task.higher_is_better, edges, p.warmup_epochs, p.startup_trials, p.reduction_factor,
                            p.margin, self.entry_epochs, p.noise)

