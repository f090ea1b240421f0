"""Do short runs' answers hold at a longer training budget? `recommend --verify --epochs N` trains the pick
and its rivals at N epochs, as a study of its own in the same storage (named NAME-Nep: resumable, never
mixed with the study's own budget), and compares the orders (explorer.transfer.order_held).
"""

from __future__ import annotations

import pandas as pd

from explorer.executors import TrialCallback, get_executor
from explorer.transfer import order_held
from explorer.formats import split, value
from explorer.recommend import Recommendation
from explorer.study import Study

MAX_KEYS = 6  # the pick and at most five rivals: each costs `seeds` long runs


def longer_study(study: Study, epochs: int, seeds: int, n: int) -> Study:
    """`study` at `epochs` epochs as a study of its own in the same storage: fixed seeds, nothing sampled or pruned."""
    spec = study.spec.model_copy(deep=True)
    spec.name = f"{spec.name}-{epochs}ep"
    spec.budget = spec.budget.model_copy(update={"epochs": epochs, "seeds": seeds})
    spec.replicates = spec.replicates.model_copy(update={"policy": "fixed"})
    spec.sampler = spec.sampler.model_copy(update={"name": "random"})
    spec.pruner = spec.pruner.model_copy(update={"name": "none"})
    spec.n_trials, spec.storage = n, study.store.url
    return Study(spec, study.source, study.space)


def verify_longer(study: Study, short: pd.DataFrame, rec: Recommendation, epochs: int, seeds: int = 3,
                  on_trial: TrialCallback | None = None) -> list[str]:
    """Train `rec`'s pick and the configurations not distinguished from it at `epochs` epochs and say, in
    lines, whether the order `short` (the study's per-configuration statistics) gave held."""
    keys = [rec.key, *[k for k in rec.tied if k != rec.key]][:MAX_KEYS]
    long = longer_study(study, epochs, seeds, len(keys))
    ostudy = long.open(create=True, force=True)
    long.queue.verification(ostudy, keys)
    get_executor(long.spec.executor.name).run(long, ostudy, on_trial)
    short = short.set_index("arch")
    longer = long.reads.summary(long.read(), draws=0).set_index("arch")
    shared = [k for k in keys if k in short.index and k in longer.index]
    higher = study.task.higher_is_better
    margin = study.spec.decision.margin(higher, float(short.loc[rec.key, "mean"]))
    fidelity = order_held({k: float(short.loc[k, "mean"]) for k in shared}, {k: float(longer.loc[k, "mean"]) for k in shared},
                          {k: int(short.loc[k, "params"]) for k in shared}, [rec.budget], margin, higher)
    verdict = "the order held" if all(fidelity.held) else "the order did NOT hold"
    near = fidelity.short_picks[0] != fidelity.long_picks[0] and all(fidelity.held)
    out = [f"at {epochs} epochs ({long.spec.name}, {len(long.seeds)} seeds): {verdict} for budget {rec.budget:,}: "
           f"short runs pick {split(fidelity.short_picks[0])}, long runs {split(fidelity.long_picks[0])}"
           + (f" (within {margin:.3g} of it)" if near else "")]
    out += [f"{split(k)}: {value(float(short.loc[k, 'mean']), higher)} at {study.spec.budget.epochs} epochs, "
            f"{value(float(longer.loc[k, 'mean']), higher)} at {epochs}" for k in shared]
    if len(shared) > 2:
        out.append(fidelity.lines()[0])
    return out
