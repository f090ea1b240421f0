"""Run a study's trials one after another in this process (Optuna's `study.optimize`)."""

from __future__ import annotations

import optuna

from explorer.errors import ExplorerError, TrialFailed
from explorer.executors import Executor, TrialCallback
from explorer.study import Study


class LocalExecutor(Executor):
    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None) -> None:
        if study.remaining(ostudy) == 0:
            return
        pruner = study.pruner()
        metric = study.task.metric

        def objective(trial: optuna.Trial) -> list[float]:
            cfg = study.suggest(trial)
            seen = study.completed(ostudy).get(cfg.key)
            if seen is not None:  # a sampler may propose a configuration again: never train it twice
                for key, value in seen.user_attrs.items():
                    trial.set_user_attr(key, value)
                trial.set_user_attr("duplicate_of", seen.number)
                return list(seen.values)
            trial.set_user_attr("config", cfg.dims)
            trial.set_user_attr("params", cfg.params)
            curve: list[float] = []

            def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
                value = metrics[metric]
                curve.append(value)
                trial.set_user_attr("curve", curve)
                if pruner.should_prune(epoch + 1, value, cfg.params, study.peers(ostudy, trial.number)):
                    raise optuna.TrialPruned(f"{metric} {value:.4g} at epoch {epoch + 1} trails its parameter bin")

            try:
                attrs = study.evaluate(cfg, on_epoch)
            except TrialFailed as err:
                trial.set_user_attr("fail_reason", str(err))
                raise
            except KeyboardInterrupt:  # Optuna marks it failed; queue its configuration for the resume
                ostudy.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
                raise
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            return study.values(attrs)

        def after(s: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
            if on_trial is not None:
                on_trial(s, t)
            if study.remaining(s) == 0 or _too_many_failures(study, s):
                s.stop()

        ostudy.optimize(objective, callbacks=[after], catch=(TrialFailed,), gc_after_trial=False)
        if _too_many_failures(study, ostudy):
            raise ExplorerError(f"stopped after {study.failures(ostudy)} failed trials (max_failures: {study.spec.max_failures}); "
                                "see `explorer status` for their reasons", source=str(study.source))


def _too_many_failures(study: Study, ostudy: optuna.Study) -> bool:
    return study.spec.max_failures is not None and study.failures(ostudy) >= study.spec.max_failures
