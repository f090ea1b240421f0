"""A study: one YAML (space, task, budget, sampler, objectives, executor) and one Optuna storage.

The Optuna storage is the single source of truth: every trial's configuration, metrics, κ values and
learning curve live there, so a study resumes, exports and renders from it at any time.
"""

from __future__ import annotations

import random
import re
import threading
import time
import warnings
from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
import pandas as pd
import sqlalchemy
import sqlalchemy.exc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from explorer import checkpoints
from explorer.conditioning import kappa_attrs, space_regime
from explorer.errors import ExplorerError, TrialFailed
from explorer.frame import trials_frame
from explorer.replicates import ReplicateSpec, wanted
from explorer.pruning import BinnedPruner, Peer, bin_edges
from explorer.sampling import BudgetSampler, Encoding, FeasibleSampler, encoding_of
from explorer.space import Config, SearchSpace, SpaceSpec, load_space
from explorer.sqlite_storage import SQLiteStorage, reading
from explorer.stats import summarize
from explorer.tasks import Task, get_task
from explorer.train import Budget, TrialResult, run_trial
from explorer.watchdog import time_limit
from explorer.yamlio import load_model

OBJECTIVE_NAMES = ("params", "flops", "train_time_s")  # besides the task's metrics
MAX_WORKER_DEATHS = 5  # a grid configuration whose trial died with its worker this often is not queued again
MAX_DUPLICATE_RUN = 200  # the sampler proposed only measured configurations this often in a row: the study stops
# what a failing storage raises: SQLAlchemy (RDB), Optuna's wrapper of it, OS errors (journal file)
STORAGE_ERRORS = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, OSError)
_OBJECTIVE = re.compile(r"^(maximize|minimize)\s+(\w+)$")


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    direction: Literal["maximize", "minimize"]
    name: str


class SamplerSpec(BaseModel):
    """Which sampler proposes configurations (explorer.sampling): `budget-ei` (explorer's own, the
    default: it won bench/search.py), Optuna's `tpe`, `gp`, `nsga2`, `random`, or `grid` (every one)."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["budget-ei", "tpe", "gp", "nsga2", "random", "grid"] = "budget-ei"
    seed: int = 0
    population_size: int = Field(8, ge=2)  # nsga2 only


class PrunerSpec(BaseModel):
    """Pruning on the per-epoch metric, fair to small models (see explorer.pruning): `dominated` stops a
    trial that, even with the largest gain its bin's complete trials made from this epoch on, would
    finish more than `margin` below a configuration with no more parameters; `median` and
    `successive-halving` compare within `param_bins` parameter bins. Replicates and verification
    trials are never pruned: their configuration is measured on purpose."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["none", "dominated", "median", "successive-halving"] = "none"
    warmup_epochs: int = Field(1, ge=1)
    startup_trials: int = Field(4, ge=1)
    reduction_factor: int = Field(2, ge=2)
    param_bins: int = Field(3, ge=1)
    margin: float = Field(0.0, ge=0)  # dominated only, in the metric's units


class ExecutorSpec(BaseModel):
    """Where trials run: `local` (in this process) or `ray` (Ray Tune; `address` joins a cluster).

    `cpu` and `gpu` are the resources of one trial (torch's CPU threads, locally); `n_jobs` trials train
    at once in a local executor's process (threads, as Optuna's `optimize(n_jobs=...)`); `max_concurrent`,
    `max_failures` (retries of a trial whose worker died), `address` and `storage_path` (where Ray Tune
    keeps trial checkpoints: a folder every node shares, or a URI such as s3://bucket/path) are Ray's.
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal["local", "ray"] = "local"
    address: str | None = None
    cpu: float = Field(1, gt=0)
    gpu: float = Field(0, ge=0)
    n_jobs: int = Field(1, ge=1)
    max_concurrent: int = Field(2, ge=1)
    max_failures: int = Field(2, ge=0)
    storage_path: str | None = None


class StudySpec(BaseModel):
    """The YAML of a study, field for field."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    space: str
    task: dict[str, Any]
    budget: Budget = Budget()
    replicates: ReplicateSpec = ReplicateSpec()  # how budget.seeds are spent: fixed or adaptive
    objectives: list[Objective] | None = None
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    n_trials: int = Field(ge=1)
    max_failures: int | None = Field(None, ge=1)
    storage: str | None = None
    storage_timeout_s: float = Field(60, gt=0)  # how long a worker waits for a locked SQLite file
    heartbeat_s: int = Field(5, ge=1)
    trial_timeout_s: float | None = Field(None, gt=0)  # wall-clock limit of one trial (explorer.watchdog)
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

    def __init__(self, spec: StudySpec, source: Path, space: SearchSpace | None = None):
        self.spec = spec
        self.source = source
        self.space: SearchSpace = space or load_space(self._path(spec.space, "space"))
        options = {k: v for k, v in spec.task.items() if k != "name"}
        for key in ("root", "path"):
            if isinstance(options.get(key), str):
                options[key] = str(self._path(options[key], f"task.{key}", must_exist=False))
        self.task: Task = get_task(spec.task["name"], options, source=str(source))
        self.objectives: list[Objective] = spec.objectives or self._default_objectives()
        self._check_objectives()
        self._check_task_fits_space()
        self._queueing = threading.Lock()
        self._sampling = threading.Lock()  # trials in threads sample one at a time, each seeing the other's proposal

    def to_data(self) -> dict[str, Any]:
        """The resolved study as plain data, for machines that do not have its files (Ray worker nodes)."""
        return {"spec": self.spec.model_dump(mode="json"), "source": str(self.source.resolve()),
                "space": self.space.to_dict(), "space_source": self.space.source}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Study:
        """The study `to_data` described, rebuilt without reading its YAML files; relative paths in it
        (task data, storage) still resolve against the original study's folder."""
        space = SearchSpace(SpaceSpec.model_validate(data["space"]), data["space_source"])
        return cls(StudySpec.model_validate(data["spec"]), Path(data["source"]), space)

    # -- resolution and validation --------------------------------------------------------------
    def _path(self, value: str, field: str, must_exist: bool = True) -> Path:
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

    # -- storage ----------------------------------------------------------------------------------
    @property
    def storage_url(self) -> str:
        """The storage URL; a relative SQLite path is relative to the study's folder, like every path here."""
        url = self.spec.storage
        if not url:
            return f"sqlite:///{(self.source.parent / f'{self.spec.name}.db').resolve()}"
        rest = url.removeprefix("sqlite:///")
        if url.startswith("sqlite:///") and rest and not rest.startswith(("/", ":memory:", "?", "file:")):
            return f"sqlite:///{(self.source.parent / rest).resolve()}"
        return url

    def paths(self) -> dict[str, str]:
        """Every place on disk this study reads or writes, resolved: `explorer run` states them."""
        out = {"study": str(self.source.resolve()), "space": str(Path(self.space.source).resolve())}
        for key in ("root", "path"):
            if isinstance(self.spec.task.get(key), str):
                out[f"task.{key}"] = str(self._path(self.spec.task[key], f"task.{key}", must_exist=False).resolve())
        file = self.storage_file()
        out["storage"] = str(file) if file else _shown(self.storage_url)  # a server: never print its password
        out["checkpoints"] = str(self.checkpoint_root.resolve())
        return out

    def storage_file(self) -> Path | None:
        """The file the storage lives in (SQLite, journal), resolved; None for a database server."""
        url = self.storage_url
        if url.startswith("journal:"):
            return self._path(url.removeprefix("journal:"), "storage", must_exist=False).resolve()
        if url.startswith("sqlite:///"):
            return Path(url.removeprefix("sqlite:///").split("?")[0])
        return None

    @property
    def checkpoint_root(self) -> Path:
        return self.source.parent / f"{self.spec.name}.ckpt"

    def storage(self) -> optuna.storages.BaseStorage:
        """The Optuna storage: RDB (SQLite default) with heartbeats, or `journal:PATH` for a journal file."""
        url = self.storage_url
        try:
            if url.startswith("journal:"):
                backend = optuna.storages.journal.JournalFileBackend(str(self.storage_file()))
                return optuna.storages.JournalStorage(backend)
            sqlite = url.startswith("sqlite")
            for attempt in range(5):
                try:  # heartbeats are "experimental" in Optuna since 2.8: say nothing about it on every open
                    with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
                        storage = (SQLiteStorage if sqlite else optuna.storages.RDBStorage)(
                            url,
                            engine_kwargs={"connect_args": {"timeout": self.spec.storage_timeout_s}} if sqlite else None,
                            heartbeat_interval=self.spec.heartbeat_s,
                            grace_period=3 * self.spec.heartbeat_s,
                            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
                        )
                    break
                except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
                    # processes creating a new storage's schema at once: one wins, the others see its rows or tables
                    racing = isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)
                    if not racing or attempt == 4:
                        raise
                    time.sleep(0.2 * (attempt + 1))
            return storage
        except Exception as err:  # sqlalchemy/OS errors vary by backend; all mean "cannot open"
            raise self.storage_error(err, "cannot open") from None

    def storage_error(self, err: BaseException, what: str = "cannot use") -> ExplorerError:
        """A storage fault (locked, read-only, full, corrupt, unreachable) as one line naming the storage."""
        while err.__cause__ is not None:  # Optuna wraps the driver's error: report the driver's words
            err = err.__cause__
        text = str(getattr(err, "orig", None) or err).strip().splitlines()
        hint = ("; install the driver (postgresql:// uses psycopg 3: pip install 'explorer[postgres]')"
                if isinstance(err, ModuleNotFoundError) else "")  # the URL names a database driver not installed
        return ExplorerError(f"{what} storage {_shown(self.storage_url)!r}: {text[0] if text else type(err).__name__}{hint}",
                             source=str(self.source), field="storage")

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

    @cached_property
    def pruner(self) -> BinnedPruner:
        p = self.spec.pruner
        edges = bin_edges([cfg.params for cfg in self.space.configs()], p.param_bins)
        return BinnedPruner(p.name, self.task.higher_is_better, edges, p.warmup_epochs, p.startup_trials, p.reduction_factor,
                            p.margin, self.spec.budget.epochs)

    @property
    def keys(self) -> list[str]:
        return [cfg.key for cfg in self.space.configs()]

    def open(self, *, create: bool = True, force: bool = False) -> optuna.Study:
        """Create the Optuna study or load the existing one, to run it; several workers may open it at once.

        An existing study whose space, task or objectives differ is refused unless `force`: its stored
        trials would silently mix two questions. A grid study queues every feasible configuration as a
        WAITING trial when it is created: workers pop queued trials atomically, so none is run twice.
        """
        storage = self._existing_storage() if not create else self.storage()
        directions = [o.direction for o in self.objectives]
        kwargs = dict(study_name=self.spec.name, storage=storage, sampler=self.sampler())
        try:
            created = False
            if create:
                try:
                    study = optuna.create_study(directions=directions, **kwargs)
                    created = True
                except optuna.exceptions.DuplicatedStudyError:
                    study = optuna.load_study(**kwargs)
            else:
                study = optuna.load_study(**kwargs)
            study.sampler = self.sampler(study)  # over the stored study's encoding
            self._check_identity(study, created, force)
        except KeyError:
            raise ExplorerError(f"no study {self.spec.name!r} in {self.storage_url}", source=str(self.source)) from None
        except STORAGE_ERRORS as err:
            raise self.storage_error(err, "cannot open") from None
        return study

    def read(self) -> optuna.Study:
        """The stored study, to read: nothing is written (no identity, no queue, no file).

        `status`, `export`, `recommend` and `dashboard` use this; `changed` says whether the YAML
        still describes the stored study.
        """
        storage = self._existing_storage()
        try:
            return optuna.load_study(study_name=self.spec.name, storage=storage)
        except KeyError:
            raise ExplorerError(f"no study {self.spec.name!r} in {_shown(self.storage_url)}", source=str(self.source)) from None
        except STORAGE_ERRORS as err:
            raise self.storage_error(err, "cannot open") from None

    def _existing_storage(self) -> optuna.storages.BaseStorage:
        """The storage of a study that must exist already: loading must not create an empty file."""
        file = self.storage_file()
        if file is not None and not file.exists():
            raise ExplorerError(f"no study {self.spec.name!r} yet: {file} does not exist (start it with `explorer run`)",
                                source=str(self.source), field="storage")
        return self.storage()

    def changed(self, study: optuna.Study) -> str | None:
        """One line saying how this YAML differs from what the stored study was made with, or None."""
        stored = study.user_attrs.get("identity")
        identity = self.identity()
        if stored is None or stored == identity:
            return None
        fields = sorted(k for k in identity if identity[k] != stored.get(k))
        return f"the stored study was made with another {', '.join(fields)}; rerun with --force to continue it anyway"

    def _check_identity(self, study: optuna.Study, created: bool, force: bool) -> None:
        """Record what the study answers (its creator does, after queueing a grid) or check it matches."""
        identity = self.identity()
        stored = study.user_attrs.get("identity")
        deadline = time.monotonic() + 10
        while stored is None and not created and time.monotonic() < deadline:  # its creator is still writing
            time.sleep(0.2)
            stored = study.user_attrs.get("identity")
        if stored is None:  # new (or its creator died before recording it)
            if [d.name.lower() for d in study.directions] != [o.direction for o in self.objectives]:
                raise ExplorerError("the stored study has other objectives", source=str(self.source), field="objectives")
            self.queue_grid(study)
            study.set_metric_names([o.name for o in self.objectives])  # optuna-dashboard and optuna.visualization label them
            for key, value in {**identity, "encoding": self.encoding().name, "spec": self.spec.model_dump(mode="json"), "space": self.space.to_dict(),
                               "baseline": self.space.baseline.key if self.space.baseline else None,
                               "metric": self.task.metric, "higher_is_better": self.task.higher_is_better,
                               "objectives": [o.model_dump() for o in self.objectives]}.items():
                study.set_user_attr(key, value)
            study.set_user_attr("identity", identity)  # last: other workers wait for it
            return
        changed = self.changed(study)
        if changed:
            if not force:
                raise ExplorerError(changed, source=str(self.source))
            study.set_user_attr("identity", identity)
            study.set_metric_names([o.name for o in self.objectives])
            self.queue_grid(study)  # a forced new space: queue its configurations no trial has taken

    def queue_grid(self, study: optuna.Study) -> list[str]:
        """Enqueue each feasible configuration no trial has taken yet (grid studies only), spread first.

        The queue is in `spread_order`, so a study whose n_trials is below the grid's size trains a
        prefix that covers the space, not the first keys in lexicographic order (all at depth 1).
        Called by the study's creator before it records the identity, so other workers find the queue
        full; only after `--force` with a new space may two workers queue the same configuration at
        once, and then the later copy is answered from storage (or waited for while it trains).
        """
        if self.spec.sampler.name != "grid":
            return []
        taken = {t.system_attrs.get("fixed_params", t.params).get("arch") for t in study.get_trials(deepcopy=False)}
        free = self.space.free_dims
        ordered = [self.keys[i] for i in spread_order([[cfg.dims[d] for d in free] for cfg in self.configs.values()])]
        missing = [key for key in ordered if key not in taken]
        for key in missing:
            study.enqueue_trial({"arch": key})
        return missing

    def waiting(self, study: optuna.Study) -> int:
        """Queued trials not yet taken by any worker, after re-queueing the work of dead workers."""
        with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
            optuna.storages.fail_stale_trials(study)  # a no-op without heartbeats (journal files)
            self._fail_unbeaten(study)
        self._requeue_lost(study)
        return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))

    def _fail_unbeaten(self, study: optuna.Study) -> None:
        """Fail and retry RUNNING trials that never recorded a heartbeat, past the grace period.

        A worker killed between taking a trial and its first heartbeat (milliseconds) leaves such a
        trial; Optuna only fails trials whose heartbeat went stale, so it would stay RUNNING forever.
        """
        storage = study._storage
        rdb = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a cache
        if not isinstance(rdb, optuna.storages.RDBStorage) or rdb.heartbeat_interval is None:
            return
        grace = rdb.grace_period or 2 * rdb.heartbeat_interval
        with reading(), rdb.engine.connect() as connection:
            beating = {row[0] for row in connection.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}
        now = datetime.now()  # Optuna stamps datetime_start with the worker's local clock, as here
        callback = storage.get_heartbeat_stale_trial_callback()
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t._trial_id in beating or t.datetime_start is None or (now - t.datetime_start).total_seconds() < grace:
                continue
            try:
                if storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL) and callback is not None:
                    callback(study, storage.get_trial(t._trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:  # another worker got there first
                continue

    def _requeue_lost(self, study: optuna.Study) -> None:
        """Queue again a grid configuration whose every trial died with its worker and was not retried.

        A worker killed after failing a stale trial but before queueing its retry loses the
        configuration; so does one past Optuna's retry limit. Up to MAX_WORKER_DEATHS per configuration:
        one that keeps killing its worker (the kernel's OOM killer) is then left failed.
        """
        if self.spec.sampler.name != "grid":
            return
        alive: set[str] = set()
        deaths: dict[str, int] = {}
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("replicate"):  # queue_replicates queues a lost replicate again
                continue
            key = t.system_attrs.get("fixed_params", t.params).get("arch")
            if t.state == optuna.trial.TrialState.FAIL and "fail_reason" not in t.user_attrs:
                deaths[key] = deaths.get(key, 0) + 1
            else:
                alive.add(key)
        for key, n in deaths.items():
            if key not in alive and key in self.configs and n < MAX_WORKER_DEATHS:
                study.enqueue_trial({"arch": key}, user_attrs={"requeued_after_deaths": n})

    def identity(self) -> dict[str, Any]:
        """What defines the question a study answers: changing it mid-study is refused."""
        return {
            "space": self.space.fingerprint,
            "task": {k: v for k, v in self.spec.task.items()},
            "budget": self.spec.budget.model_dump(mode="json", exclude={"seeds"}),
            "objectives": [f"{o.direction} {o.name}" for o in self.objectives],
        }

    # -- one trial ----------------------------------------------------------------------------------
    @cached_property
    def configs(self) -> dict[str, Config]:
        return {cfg.key: cfg for cfg in self.space.configs()}

    def suggest(self, trial: optuna.Trial) -> Config:
        """The trial's configuration as the sampler proposed it: always feasible (explorer.sampling).

        Its ordered parameters (layers, heads, ...) are what samplers model; its key is stored as the
        categorical `arch` too, which queues, executors and dashboards read.
        """
        with self._sampling:  # Optuna samples lazily, at the first suggest: the whole proposal is stored inside the lock
            return self.encoding(trial.study if not hasattr(self, "_encoding") else None).suggest(trial)

    def checkpoint_dir(self, cfg: Config, lineage: int) -> Path:
        """Where the trial `lineage` (and its retries) keeps its checkpoint (explorer.checkpoints)."""
        return checkpoints.folder(self.checkpoint_root, cfg.key, lineage)

    lineage = staticmethod(checkpoints.lineage)

    def requeue(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Queue a trial that did not finish (interrupted, reclaimed) again: its retry resumes its checkpoint,
        at its seed (a replicate stays one)."""
        kept = {k: trial.user_attrs[k] for k in ("seed", "replicate", "verify") if k in trial.user_attrs}
        study.enqueue_trial(trial.params, user_attrs={**kept, "retry_of": self.lineage(trial)})

    # -- replicates ---------------------------------------------------------------------------------
    @property
    def seeds(self) -> list[int]:
        return self.spec.budget.seed_list

    def seed_of(self, trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
        """The seed a trial trains with: a queued replicate's own, else the first (every configuration starts there)."""
        return int(trial.user_attrs.get("seed", self.seeds[0]))

    def summary(self, study: optuna.Study, draws: int | None = None) -> pd.DataFrame:
        """Per-configuration statistics of the stored measurements (explorer.stats.summarize)."""
        objectives = [(o.name, o.direction) for o in self.objectives]
        kwargs = {} if draws is None else {"draws": draws}
        return summarize(trials_frame(study), self.task.metric, objectives, **kwargs)

    def queue_replicates(self, study: optuna.Study) -> list[tuple[str, int]]:
        """Queue the replicates the policy wants now (explorer.replicates); returns (configuration, seed) pairs.

        Derived from the storage each time, so a resumed study queues exactly what is missing: a seed is
        taken once any trial of it is complete, pruned, running, queued or failed by itself (one whose
        worker died is retried or queued again here). `fixed` queues every missing seed of each measured
        configuration; `adaptive` queues one more seed per uncertain configuration, in rounds, only once
        every configuration the study asked for is measured and nothing is queued or running.
        """
        seeds = self.seeds
        if len(seeds) == 1:
            return []
        with self._queueing:  # trials in threads (executor.n_jobs) end together: one queues the round
            return self._queue_replicates(study, seeds)

    def _queue_replicates(self, study: optuna.Study, seeds: list[int]) -> list[tuple[str, int]]:
        trials = study.get_trials(deepcopy=False)
        adaptive = self.spec.replicates.policy == "adaptive"
        busy = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
        if adaptive and (any(t.state in busy for t in trials) or self._to_n(study, trials) > 0):
            return []
        taken: dict[str, set[int]] = {}
        deaths: dict[tuple[str, int], int] = {}
        for t in trials:
            key, seed = t.system_attrs.get("fixed_params", t.params).get("arch"), self.seed_of(t)
            died = t.state == optuna.trial.TrialState.FAIL and "fail_reason" not in t.user_attrs
            deaths[key, seed] = deaths.get((key, seed), 0) + died
            if not died or deaths[key, seed] >= MAX_WORKER_DEATHS:  # one that keeps killing its worker is left
                taken.setdefault(key, set()).add(seed)
        queued = []
        for key in wanted(self.summary(study, draws=None if adaptive else 0), len(seeds), self.spec.replicates):
            missing = [s for s in seeds if s not in taken.get(key, set())]
            for seed in missing[:1] if adaptive else missing:
                study.enqueue_trial({"arch": key}, user_attrs={"seed": seed, "replicate": True})
                queued.append((key, seed))
        return queued

    def replicate_cost(self, study: optuna.Study) -> tuple[int, int]:
        """(runs measured, runs that every measured configuration at the maximum seeds would take)."""
        summary = self.summary(study, draws=0)
        return int(summary["n"].sum()) if len(summary) else 0, len(summary) * len(self.seeds)

    def attrs(self, cfg: Config, result: TrialResult, seed: int) -> dict[str, Any]:
        """What a finished trial stores besides its objective values."""
        dims = cfg.dims
        return {
            "config": dims,
            **{k: dims[k] for k in ("layers", "heads", "width", "mlp") if k in dims},
            "params": cfg.params,
            "flops": self.space.family.flops(dims),
            "seed": seed,
            **result.metrics,
            **kappa_attrs(result.kappa_init, result.kappa_final, space_regime(self.space)),
            "train_time_s": result.train_time_s,
            "steps": result.steps,
            "device": result.device,
        }

    def evaluate(self, cfg: Config, lineage: int, on_epoch: Callable[[int, dict[str, float]], None] | None = None,
                 device: str | None = None, checkpoint_dir: Path | None = None, seed: int | None = None) -> dict[str, Any]:
        """Train `cfg` at `seed` (default: the first) as trial `lineage` (resuming its own checkpoint if a
        killed run left one) and return its attributes.

        Any failure inside the trial (NaN loss, out of memory, an error in the model, running past
        `trial_timeout_s`) becomes `TrialFailed(reason)`, so the study goes on; an `ExplorerError`
        (the task's data is bad) is the study's, not the trial's, and stops it; pruning and interrupts
        pass through. A pruned or stopped trial (Ray Tune ends a stopped trial's thread with
        SystemExit) leaves no checkpoint for a later trial of the same configuration to resume.
        `checkpoint_dir` defaults to the trial's folder beside the study (Ray passes one in the trial's
        working dir).
        """
        seed = self.seeds[0] if seed is None else seed
        budget = self.spec.budget.model_copy(update={"seed": seed})
        owner = {"study": self.spec.name, "trial": lineage, "config": cfg.key, "budget": budget.model_dump(mode="json", exclude={"seeds"})}
        # another run's checkpoint is not resumed
        ckpt = checkpoints.claim(checkpoint_dir or self.checkpoint_dir(cfg, lineage), owner)
        start = time.perf_counter()
        try:
            with time_limit(self.spec.trial_timeout_s):
                result = run_trial(cfg.family, cfg.dims, self.task, budget, callback=on_epoch,
                                   checkpoint_dir=ckpt, device=device)
        except KeyboardInterrupt:  # kept: the resumed trial continues from its checkpoint
            raise
        except (optuna.TrialPruned, TrialFailed, ExplorerError, SystemExit):
            checkpoints.remove(ckpt)
            raise
        except Exception as err:
            checkpoints.remove(ckpt)
            raise TrialFailed(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        checkpoints.remove(ckpt)
        return {**self.attrs(cfg, result, seed), "curve": result.curve, "trial_time_s": time.perf_counter() - start}

    def answer_from_storage(self, study: optuna.Study, trial: optuna.Trial, cfg: Config) -> list[float] | None:
        """The values of an earlier measurement of `cfg` at `trial`'s seed, recording `trial` as its duplicate; else None.

        A sampler may propose a measured configuration again: it is not trained twice. Optuna's
        sampler learns from the duplicate's values, and every explorer consumer (n_trials, pruning
        peers, the frame, recommendation, dashboard) skips it by its `duplicate_of` attr. Both
        executors answer duplicates here.
        """
        seen = self.completed(study).get((cfg.key, self.seed_of(trial)))
        if seen is None:
            return None
        trial.set_user_attr("config", cfg.dims)
        trial.set_user_attr("params", cfg.params)
        trial.set_user_attr("duplicate_of", seen.number)
        return list(seen.values)

    def reclaim_running(self, study: optuna.Study) -> list[int]:
        """Mark RUNNING trials failed and queue their configurations again.

        For storages without heartbeats (journal files), after a crash, when no other worker is
        running: with heartbeats this happens by itself after the grace period.
        """
        numbers = []
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            self.requeue(study, t)
            numbers.append(t.number)
        return numbers

    def values(self, attrs: dict[str, Any]) -> list[float]:
        """The objective values, in the study's order, from a trial's stored attributes."""
        return [float(attrs[o.name]) for o in self.objectives]

    @staticmethod
    def _measured(t: optuna.trial.FrozenTrial) -> bool:
        """Whether a trial is a measurement: complete, pruned, or failed by itself.

        A duplicate answered from storage is not; nor a trial failed because its worker died (stale
        heartbeat, no `fail_reason`): it is retried.
        """
        if "duplicate_of" in t.user_attrs:
            return False
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return t.state in done or (t.state == optuna.trial.TrialState.FAIL and "fail_reason" in t.user_attrs)

    @classmethod
    def _counts(cls, t: optuna.trial.FrozenTrial) -> bool:
        """Whether a trial counts towards `n_trials`: a measurement of a configuration, not a replicate of one."""
        return cls._measured(t) and not t.user_attrs.get("replicate")

    def finished(self, study: optuna.Study) -> int:
        """Measurements so far, replicates included (see `_measured`)."""
        return sum(self._measured(t) for t in study.get_trials(deepcopy=False))

    def configurations(self, study: optuna.Study) -> int:
        """Configurations measured so far (complete, pruned or failed by itself): what `n_trials` counts."""
        return len({t.params.get("arch") for t in study.get_trials(deepcopy=False) if self._counts(t)})

    def failures(self, study: optuna.Study) -> int:
        return sum(t.state == optuna.trial.TrialState.FAIL and "fail_reason" in t.user_attrs for t in study.get_trials(deepcopy=False))

    def too_many_failures(self, study: optuna.Study) -> bool:
        """Whether `max_failures` trials failed by themselves: the study stops, it would fail them all."""
        return self.spec.max_failures is not None and self.failures(study) >= self.spec.max_failures

    def peers(self, study: optuna.Study, number: int) -> list[Peer]:
        """The other trials' parameter counts and per-epoch curves, for pruning: distinct measurements only."""
        return self._peers(study.get_trials(deepcopy=False), number)

    @staticmethod
    def _peers(trials: list[optuna.trial.FrozenTrial], number: int) -> list[Peer]:
        return [Peer(t.user_attrs["params"], t.user_attrs["curve"], t.params.get("arch")) for t in trials
                if t.number != number and "curve" in t.user_attrs and "params" in t.user_attrs and "duplicate_of" not in t.user_attrs]

    def should_prune(self, study: optuna.Study, number: int, epoch: int, value: float, cfg: Config) -> bool:
        """Whether the pruner stops trial `number` after `epoch` (from 1). Replicates and verification
        trials run to the end: their configuration is measured on purpose."""
        if self.spec.pruner.name == "none":
            return False
        trials = study.get_trials(deepcopy=False)
        attrs = trials[number].user_attrs
        if attrs.get("replicate") or attrs.get("verify"):
            return False
        return self.pruner.should_prune(epoch, value, cfg.params, self._peers(trials, number), cfg.key)

    def completed(self, study: optuna.Study) -> dict[tuple[str, int], optuna.trial.FrozenTrial]:
        """The first completed measurement of each (configuration, seed)."""
        out: dict[tuple[str, int], optuna.trial.FrozenTrial] = {}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if "duplicate_of" not in t.user_attrs:
                out.setdefault((t.params.get("arch"), self.seed_of(t)), t)
        return out

    def queue_verification(self, study: optuna.Study, keys: list[str]) -> list[str]:
        """Queue configurations `recommend --verify` asks for; they run even once `n_trials` is reached.

        A configuration already measured is not queued; one waiting in a grid's queue is marked.
        """
        trials = study.get_trials(deepcopy=False)
        taken = {t.system_attrs.get("fixed_params", t.params).get("arch"): t for t in trials}
        queued = []
        for key in keys:
            t = taken.get(key)
            if t is None:
                study.enqueue_trial({"arch": key}, user_attrs={"verify": True})
            elif t.state == optuna.trial.TrialState.WAITING:
                study._storage.set_trial_user_attr(t._trial_id, "verify", True)  # no public API marks a queued trial
            else:
                continue
            queued.append(key)
        return queued

    def stalled(self, study: optuna.Study) -> bool:
        """Whether the sampler's last MAX_DUPLICATE_RUN proposals were all measured already."""
        last = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()][-MAX_DUPLICATE_RUN:]
        return len(last) == MAX_DUPLICATE_RUN and all("duplicate_of" in t.user_attrs for t in last)

    def remaining(self, study: optuna.Study) -> int:
        """Trials still to run: configurations to measure up to `n_trials` (no more than those never
        measured), plus queued replicates and verification trials, which run whatever `n_trials` says."""
        trials = study.get_trials(deepcopy=False)
        extra = sum(t.state == optuna.trial.TrialState.WAITING and bool(t.user_attrs.get("verify") or t.user_attrs.get("replicate"))
                    for t in trials)
        return self._to_n(study, trials) + extra

    def unstarted(self, study: optuna.Study) -> int:
        """Trials no worker has started yet: `remaining` less the configurations being measured now,
        and for a grid no more than its queue (what a worker asking now would get)."""
        trials = study.get_trials(deepcopy=False)
        waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
        extra = sum(bool(t.user_attrs.get("verify") or t.user_attrs.get("replicate")) for t in waiting)
        running = sum(t.state == optuna.trial.TrialState.RUNNING and not (t.user_attrs.get("verify") or t.user_attrs.get("replicate"))
                      for t in trials)
        left = max(0, self._to_n(study, trials) - running) + extra
        return min(left, len(waiting)) if self.spec.sampler.name == "grid" else left

    def _to_n(self, study: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> int:
        """Configurations still to measure before `n_trials` is reached (0 once the sampler stalled)."""
        counted = [t for t in trials if self._counts(t)]
        unmeasured = len(self.configs.keys() - {t.params.get("arch") for t in counted})
        return 0 if self.stalled(study) else min(max(0, self.spec.n_trials - len(counted)), unmeasured)


def spread_order(points: list[list[Any]], exact_up_to: int = 4096) -> list[int]:
    """Indices of `points` ordered so that every prefix spreads over them: greedy farthest-point
    (maximin) on each dimension's value rank scaled to [0, 1], starting at the first point.

    Quadratic in the number of points; past `exact_up_to` a seeded shuffle, which spreads in expectation.
    """
    n = len(points)
    if n > exact_up_to:
        order = list(range(n))
        random.Random(0).shuffle(order)
        return order
    columns = list(zip(*points))
    ranks = [{v: i / max(len(set(col)) - 1, 1) for i, v in enumerate(sorted(set(col)))} for col in columns]
    x = np.array([[rank[v] for rank, v in zip(ranks, p, strict=True)] for p in points], dtype=float).reshape(n, len(columns))
    order = [0]
    nearest = np.linalg.norm(x - x[0], axis=1)
    nearest[0] = -np.inf  # taken
    for _ in range(n - 1):
        nxt = int(np.argmax(nearest))  # ties: the earliest point, so the order is deterministic
        order.append(nxt)
        nearest = np.minimum(nearest, np.linalg.norm(x - x[nxt], axis=1))
        nearest[nxt] = -np.inf
    return order


def _shown(url: str) -> str:
    """A storage URL fit for messages and logs: a server's password is masked."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an RDB URL (journal:PATH) or not parseable: nothing to hide in it
        return url


def load_study_spec(path: str | Path) -> Study:
    """Load a study YAML and everything it names; every error names the file and the field."""
    return Study(load_model(StudySpec, path), Path(path))
