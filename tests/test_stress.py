"""Proof under stress (issue 28): 4 `explorer run` processes x 2 threads on one study of the default's size
(24 configurations x 3 seeds, tiny models), on SQLite, a journal file and PostgreSQL, one worker SIGKILLed
at random moments while it trains, three times, and started again, while another process loads the CPU. Afterwards every
(configuration, seed) is complete exactly once, nothing is left running or queued, and `explorer status`
agrees with the storage. The runner is bench/workers.py's `stress` (the bench runs 8 workers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.workers import stress  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["sqlite", "journal", "postgresql"])
def test_workers_killed_and_restarted_under_load_train_every_configuration_and_seed_once(storage: str, tmp_path: Path,
                                                                                          request: pytest.FixtureRequest) -> None:
    url = {"sqlite": f"sqlite:///{tmp_path / 'stress.db'}", "journal": "journal:stress.log"}.get(storage)
    if url is None:
        url = request.getfixturevalue("server").database()
    out = stress(url, tmp_path, processes=4, threads=2, kills=3, seed=len(storage))
    log = (tmp_path / "workers.log").read_text()
    assert out.kills == 3, log[-3000:]
    print(out)  # reclaimed: trials whose worker was killed mid-trial, each retried by the others
    assert out.right, f"{out}\n{log[-20000:]}"  # a hung worker's stacks are at the end
