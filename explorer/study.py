"""A study: one YAML (space, task, budget, sampler, objectives, executor) and one Optuna storage.

The Optuna storage is the single source of truth: every trial's configuration, metrics, κ values and
learning curve live there, so a study resumes, exports and renders from it at any time.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from explorer.errors import ExplorerError, TrialFailed
from explorer.pruning import BinnedPruner, Peer, bin_edges
from explorer.space import Config, SearchSpace, load_space
from explorer.tasks import Task, get_task
from explorer.train import Budget, TrialResult, run_trial
from explorer.yamlio import read_yaml, validation_error

OBJECTIVE_NAMES = ("params", "flops", "train_time_s")  # besides the task's metrics
_OBJECTIVE = re.compile(r"^(maximize|minimize)\s+(\w+)$")


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    direction: Literal["maximize", "minimize"]
    name: str


class SamplerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["nsga2", "tpe", "grid", "random"] = "nsga2"
    seed: int = 0
    population_size: int = Field(8, ge=2)  # nsga2 only


class PrunerSpec(BaseModel):
    """Pruning on the per-epoch metric within parameter bins (see explorer.pruning); the Ray executor
    runs successive-halving as ASHA."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["none", "median", "successive-halving"] = "none"
    warmup_epochs: int = Field(1, ge=1)
    startup_trials: int = Field(4, ge=1)
    reduction_factor: int = Field(2, ge=2)
    param_bins: int = Field(3, ge=1)


class ExecutorSpec(BaseModel):
    """Where trials run: `local` (in this process) or `ray` (Ray Tune; `address` joins a cluster)."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["local", "ray"] = "local"
    address: str | None = None
    cpu: float = Field(1, gt=0)
    gpu: float = Field(0, ge=0)
    max_concurrent: int = Field(2, ge=1)
    max_failures: int = Field(2, ge=0)


class StudySpec(BaseModel):
    """The YAML of a study, field for field."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    space: str
    task: dict[str, Any]
    budget: Budget = Budget()
    objectives: list[Objective] | None = None
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    n_trials: int = Field(ge=1)
    max_failures: int | None = Field(None, ge=1)
    storage: str | None = None
    heartbeat_s: int = Field(5, ge=1)
    executor: ExecutorSpec = ExecutorSpec()

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

    @field_validator("task")
    @classmethod
    def _task_named(cls, value: dict) -> dict:
        if not isinstance(value.get("name"), str):
            raise ValueError("the task needs a name (e.g. digits, listops, image-folder, text-file)")
        return value


class Study:
    """A study spec resolved against its files: space, task, objectives, storage, Optuna study."""

    def __init__(self, spec: StudySpec, source: Path):
        self.spec = spec
        self.source = source
        self.space: SearchSpace = load_space(self._path(spec.space, "space"))
        options = {k: v for k, v in spec.task.items() if k != "name"}
        for key in ("root", "path"):
            if isinstance(options.get(key), str):
                options[key] = str(self._path(options[key], f"task.{key}", must_exist=False))
        self.task: Task = get_task(spec.task["name"], options, source=str(source))
        self.objectives: list[Objective] = spec.objectives or self._default_objectives()
        self._check_objectives()
        self._check_task_fits_space()

    # -- resolution and validation --------------------------------------------------------------
    def _path(self, value: str, field: str, must_exist: bool = True) -> Path:
        """A path in the spec is relative to the spec's folder; say so when it is missing."""
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = self.source.parent / path
        if must_exist and not path.exists():
            raise ExplorerError(f"{path} does not exist", source=str(self.source), field=field)
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
                                    source=str(self.source), field=f"task")

    # -- storage ----------------------------------------------------------------------------------
    @property
    def storage_url(self) -> str:
        if self.spec.storage:
            return self.spec.storage
        return f"sqlite:///{(self.source.parent / f'{self.spec.name}.db').resolve()}"

    @property
    def checkpoint_root(self) -> Path:
        return self.source.parent / f"{self.spec.name}.ckpt"

    def storage(self) -> optuna.storages.BaseStorage:
        """The Optuna storage: RDB (SQLite default) with heartbeats, or `journal:PATH` for a journal file."""
        url = self.storage_url
        try:
            if url.startswith("journal:"):
                path = self._path(url.removeprefix("journal:"), "storage", must_exist=False)
                backend = optuna.storages.journal.JournalFileBackend(str(path))
                return optuna.storages.JournalStorage(backend)
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
                heartbeat_interval=self.spec.heartbeat_s,
                grace_period=3 * self.spec.heartbeat_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
            )
        except Exception as err:  # sqlalchemy/OS errors vary by backend; all mean "cannot open"
            raise ExplorerError(f"cannot open storage {url!r}: {str(err).splitlines()[0]}", source=str(self.source), field="storage") from None

    def sampler(self) -> optuna.samplers.BaseSampler:
        s = self.spec.sampler
        if s.name == "grid":
            return optuna.samplers.GridSampler({"arch": self.keys}, seed=s.seed)
        if s.name == "tpe":
            return optuna.samplers.TPESampler(seed=s.seed, multivariate=True)
        if s.name == "random":
            return optuna.samplers.RandomSampler(seed=s.seed)
        return optuna.samplers.NSGAIISampler(population_size=s.population_size, seed=s.seed)

    def pruner(self) -> BinnedPruner:
        p = self.spec.pruner
        edges = bin_edges([cfg.params for cfg in self.space.configs()], p.param_bins)
        return BinnedPruner(p.name, self.task.higher_is_better, edges, p.warmup_epochs, p.startup_trials, p.reduction_factor)

    @property
    def keys(self) -> list[str]:
        return [cfg.key for cfg in self.space.configs()]

    def open(self, *, create: bool = True, force: bool = False) -> optuna.Study:
        """Create the Optuna study or load the existing one (Optuna's `load_if_exists`).

        An existing study whose space, task or objectives differ is refused unless `force`: its stored
        trials would silently mix two questions.
        """
        storage = self.storage()
        directions = [o.direction for o in self.objectives]
        kwargs = dict(study_name=self.spec.name, storage=storage, sampler=self.sampler())
        try:
            if create:
                study = optuna.create_study(directions=directions, load_if_exists=True, **kwargs)
            else:
                study = optuna.load_study(**kwargs)
        except KeyError:
            raise ExplorerError(f"no study {self.spec.name!r} in {self.storage_url}", source=str(self.source)) from None
        except Exception as err:
            raise ExplorerError(f"cannot open storage {self.storage_url!r}: {str(err).splitlines()[0]}", source=str(self.source), field="storage") from None
        identity = self.identity()
        stored = study.user_attrs.get("identity")
        if stored is None:
            if [d.name.lower() for d in study.directions] != directions:
                raise ExplorerError("the stored study has other objectives", source=str(self.source), field="objectives")
            for key, value in {**identity, "spec": self.spec.model_dump(mode="json"), "space": self.space.to_dict(),
                               "baseline": self.space.baseline.key if self.space.baseline else None,
                               "metric": self.task.metric, "higher_is_better": self.task.higher_is_better,
                               "objectives": [o.model_dump() for o in self.objectives]}.items():
                study.set_user_attr(key, value)
            study.set_user_attr("identity", identity)
        elif stored != identity:
            changed = sorted(k for k in identity if identity[k] != stored.get(k))
            if not force:
                raise ExplorerError(f"the stored study was made with another {', '.join(changed)}; rerun with --force to continue it anyway",
                                    source=str(self.source))
            study.set_user_attr("identity", identity)
        return study

    def identity(self) -> dict[str, Any]:
        """What defines the question a study answers: changing it mid-study is refused."""
        return {
            "space": self.space.fingerprint,
            "task": {k: v for k, v in self.spec.task.items()},
            "budget": self.spec.budget.model_dump(mode="json"),
            "objectives": [f"{o.direction} {o.name}" for o in self.objectives],
        }

    # -- one trial ----------------------------------------------------------------------------------
    @cached_property
    def configs(self) -> dict[str, Config]:
        return {cfg.key: cfg for cfg in self.space.configs()}

    def suggest(self, trial: optuna.Trial) -> Config:
        """Sample only feasible configurations: a categorical over their keys."""
        return self.configs[trial.suggest_categorical("arch", self.keys)]

    def checkpoint_dir(self, cfg: Config) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.key)
        return self.checkpoint_root / safe

    def attrs(self, cfg: Config, result: TrialResult) -> dict[str, Any]:
        """What a finished trial stores besides its objective values."""
        dims = cfg.dims
        return {
            "config": dims,
            **{k: dims[k] for k in ("layers", "heads", "width", "mlp") if k in dims},
            "params": cfg.params,
            "flops": self.space.family.flops(dims),
            **result.metrics,
            "kappa_init": result.kappa_init,
            "kappa_final": result.kappa_final,
            "kappa_init_mean": geometric_mean(result.kappa_init),
            "kappa_final_mean": geometric_mean(result.kappa_final),
            "train_time_s": result.train_time_s,
            "steps": result.steps,
            "device": result.device,
        }

    def evaluate(self, cfg: Config, on_epoch: Callable[[int, dict[str, float]], None] | None = None,
                 device: str | None = None) -> dict[str, Any]:
        """Train `cfg` (resuming its checkpoint if a killed run left one) and return its trial attributes.

        Any failure inside the trial (NaN loss, out of memory, an error in the model) becomes
        `TrialFailed(reason)`, so the study goes on; pruning and interrupts pass through.
        """
        ckpt = self.checkpoint_dir(cfg)
        try:
            result = run_trial(cfg.family, cfg.dims, self.task, self.spec.budget, callback=on_epoch,
                               checkpoint_dir=ckpt, device=device)
        except (optuna.TrialPruned, KeyboardInterrupt, TrialFailed):
            raise
        except Exception as err:
            raise TrialFailed(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        else:
            shutil.rmtree(ckpt, ignore_errors=True)
        return {**self.attrs(cfg, result), "curve": result.curve}

    def reclaim_running(self, study: optuna.Study) -> list[int]:
        """Mark RUNNING trials failed and queue their configurations again.

        For storages without heartbeats (journal files), after a crash, when no other worker is
        running: with heartbeats this happens by itself after the grace period.
        """
        numbers = []
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
            numbers.append(t.number)
        return numbers

    def values(self, attrs: dict[str, Any]) -> list[float]:
        """The objective values, in the study's order, from a trial's stored attributes."""
        return [float(attrs[o.name]) for o in self.objectives]

    def finished(self, study: optuna.Study) -> int:
        """Trials that count towards `n_trials`: complete, pruned, or failed by the trial itself.

        A trial failed because its worker died (stale heartbeat) does not count: it is retried.
        """
        trials = study.get_trials(deepcopy=False)
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return sum(t.state in done or (t.state == optuna.trial.TrialState.FAIL and "fail_reason" in t.user_attrs) for t in trials)

    def failures(self, study: optuna.Study) -> int:
        return sum(t.state == optuna.trial.TrialState.FAIL and "fail_reason" in t.user_attrs for t in study.get_trials(deepcopy=False))

    def peers(self, study: optuna.Study, number: int) -> list[Peer]:
        """The other trials' parameter counts and per-epoch curves, for pruning."""
        return [Peer(t.user_attrs["params"], t.user_attrs["curve"]) for t in study.get_trials(deepcopy=False)
                if t.number != number and "curve" in t.user_attrs and "params" in t.user_attrs]

    def completed(self, study: optuna.Study) -> dict[str, optuna.trial.FrozenTrial]:
        """The first completed trial of each configuration."""
        out: dict[str, optuna.trial.FrozenTrial] = {}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            out.setdefault(t.params.get("arch"), t)
        return out

    def remaining(self, study: optuna.Study) -> int:
        return max(0, self.spec.n_trials - self.finished(study))


def geometric_mean(values: list[float]) -> float | None:
    """κ spans orders of magnitude: its typical value over blocks is a geometric mean."""
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, finite)) / len(finite)) if finite else None


def load_study_spec(path: str | Path) -> Study:
    """Load a study YAML and everything it names; every error names the file and the field."""
    source = Path(path)
    data = read_yaml(source)
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as err:
        raise validation_error(err, str(source)) from None
    return Study(spec, source)
