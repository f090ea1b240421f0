"""Measuring a split the posterior picks past the space's declared ranges (explorer.recommend): `recommend
--verify` at a budget above the space trains it at the study's budget and seeds, as a study of its own
(NAME-beyond, in the same storage: resumable, never mixed with the study's own), whose space is the
study's with its ranges continued (explorer.space.wider), and says what it measured beside the prediction.
"""

from __future__ import annotations

import numpy as np

from explorer.executors import TrialCallback, get_executor
from explorer.formats import interval, plural, split, value
from explorer.recommend import Recommendation
from explorer.space import wider
from explorer.study import Study


def verify_outside(study: Study, rec: Recommendation, on_trial: TrialCallback | None = None) -> list[str]:
    """Train `rec.outside` in NAME-beyond and return the line saying what it measured."""
    key = str(rec.outside)
    spec = study.spec.model_copy(deep=True)
    spec.name, spec.n_trials, spec.storage = f"{spec.name}-beyond", 1, study.store.url
    spec.replicates = spec.replicates.model_copy(update={"policy": "fixed"})
    spec.sampler = spec.sampler.model_copy(update={"name": "random"})
    spec.pruner = spec.pruner.model_copy(update={"name": "none"})
    beyond = Study(spec, study.source, wider(study.space, rec.budget))
    ostudy = beyond.open(create=True, force=True)
    beyond.queue.verification(ostudy, [key])
    get_executor(spec.executor.name).run(beyond, ostudy, on_trial)
    row = beyond.reads.summary(beyond.read(), draws=0).set_index("arch").loc[key]
    like = study.task.higher_is_better
    said = f" ({interval(row['lo'], row['hi'], like)})" if np.isfinite(row["lo"]) else ""
    return [f"{split(key)} measured in {spec.name} ({plural(int(row['n']), 'seed')}): {study.task.metric} "
            f"{value(row['raw'], like)}{said}"]

