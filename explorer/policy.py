"""Which runs a study buys next (the `decide` replicate policy): the value of each run for the answers at the
study's budgets, per second of training, chosen jointly for every free worker.

A round reads the one posterior (explorer.posterior) and hands out up to `batch` runs (the free workers). The
runs in flight (`pending`) are imagined first (explorer.posterior.Posterior.imagine: their results drawn from
the posterior, the spread after them), so a round never spends a worker on what a running trial will tell, and
each run chosen is imagined before the next (a greedy batch, as fantasies in batch Bayesian optimization). A
row may come back more than once: distinct seeds of one configuration at one length.

What a round buys, in order:
1. Until the run noise rests on MIN_NOISE_DOF degrees of freedom of replicates there is too little to weigh a
   run by (a bound's own spread is mostly the noise level's): the best means of each question get one more seed
   at the shortest length (the cheapest), enough to reach it.
2. A question whose bound is within the margin but whose pick lacks MIN_OWN runs of its own at the answer's
   length gets them (explorer.decisions: no decision rests on the surface alone).
3. Successive halving within each question (`promotions`), by the posterior's odds rather than by rank: every
   configuration whose chance of being within the margin of the best at the target is material goes one rung
   up, continuing its longest run (10 to 20 epochs costs 12, not 22), whether or not the question can be decided.
4. Each undecided question that can still be decided under the seed cap (`futile`: not even every contender
   at the cap at the target would bring its bound within the margin, and it gets nothing more; its answer says
   so) gets runs by value: the shrinkage of the bounds' excess over the margin per second (explorer.voi.greedy),
   only for configurations whose chance of being within the margin of the best is material (successive halving
   by the posterior's odds), at any length of the ladder (a promotion continues a seed's run and pays only its
   extra epochs; a new seed at a short length is cheap), a fresh seed where that is what the bound needs.
5. While the target length's own replicates give fewer than MIN_NOISE_DOF degrees of freedom, runs at the
   target where they shrink the bounds most (by value, not by rank).
6. The baseline catches up while a verdict against it rests on fewer of its seeds than the pick has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from explorer.decisions import MIN_NOISE_DOF, MIN_OWN, distinct, noise_dof, verdict
from explorer.posterior import Posterior, at_length, lengths
from explorer.rows import row_key, split_row
from explorer.voi import MATERIAL, greedy


def next_seeds(posterior: Posterior, budgets: Sequence[int], delta: float, level: float, room: Mapping[str, int],
               batch: int | None = None, baseline: str | None = None, epochs: int | None = None,
               pending: Mapping[str, int] | None = None) -> list[str]:
    """The runs to start now: measured configurations (one more seed each time one appears), or with several
    lengths (`posterior` the whole one, `epochs` the target) rows, a configuration at a length. `room[row]`: how
    many more runs a row may get (the cap, less those stored and in flight); `batch`: at most this many (the
    free workers; default one per undecided question, at least 2); `pending`: the runs in flight per row."""
    ladder = lengths(posterior) if epochs is not None else []
    view = at_length(posterior, epochs) if ladder else posterior
    at = (lambda k: row_key(k, epochs)) if ladder else (lambda k: k)  # noqa: E731 - a configuration's row at the target
    measured = {split_row(k)[0] for k, n in zip(posterior.keys, posterior.n) if n > 0}
    if not posterior.has_intervals or posterior.noise is None or posterior.noise.dof < MIN_NOISE_DOF:
        short = at_length(posterior, ladder[0]) if ladder else posterior  # too little to weigh runs by: cheap seeds
        return _first_replicates(short, list(distinct(short, budgets)), measured, room, batch,
                                 (lambda k: row_key(k, ladder[0])) if ladder else at, posterior.noise.dof if posterior.noise else 0)
    questions = list(distinct(view, budgets))
    pending = {k: n for k, n in (pending or {}).items() if k in posterior.index and n > 0}
    state = posterior.imagine(pending) if pending else (posterior.latent_draws, posterior.latent_cov)
    rows = list(view.keys) if not ladder else [at(k) for k in view.keys]
    draws = state[0][:, [posterior.index[r] for r in rows]]
    regrets = [view.regret(q, level, draws) for q in questions]
    left = {k: int(v) for k, v in room.items()}
    want: Counter[str] = Counter()
    steps = batch or max(2, sum(r.eps > delta for r in regrets))

    def buy(got: Mapping[str, int]) -> None:
        for row, n in got.items():
            n = min(n, left.get(row, 0), steps - sum(want.values()))
            if n > 0:
                want[row] += n
                left[row] -= n

    own = lambda k: int(posterior.n[posterior.index[at(k)]]) + pending.get(at(k), 0)  # noqa: E731
    buy({at(r.pick): MIN_OWN - own(r.pick) for r in regrets if r.eps <= delta and r.pick in measured and own(r.pick) < MIN_OWN})
    if ladder:
        buy(promotions(posterior, questions, delta, ladder, epochs, pending, left, state))
    options = {row_key(k, e) if ladder else k: left.get(row_key(k, e) if ladder else k, 0)
               for k in measured for e in (ladder or [None])}
    undecided = [tuple(at(k) for k in q) for q, r in zip(questions, regrets) if r.eps > delta]
    open_ = [q for q in undecided if not futile(posterior, q, delta, level, {at(k): left.get(at(k), 0) for k in measured}, state)]
    if open_ and sum(want.values()) < steps:
        got, _ = greedy(posterior, open_, delta, level, options, steps - sum(want.values()), repeat=True, ladder=ladder, state=state)
        buy(got)
    target_dof = noise_dof(view) + sum(n for k, n in pending.items() if not ladder or split_row(k)[1] == epochs)
    if target_dof + sum(want.values()) < MIN_NOISE_DOF and sum(want.values()) < steps:
        sets = [tuple(at(k) for k in q) for q in questions]
        got, _ = greedy(posterior, sets, delta, level, {at(k): left.get(at(k), 0) for k in measured},
                        min(steps - sum(want.values()), MIN_NOISE_DOF - int(target_dof)), repeat=True, state=state, goal=0.0)
        buy(got or {at(r.pick): 1 for r in regrets if r.pick in measured})  # nothing shrinks a bound: the picks' own
    if baseline is not None and baseline in measured and left.get(at(baseline), 0) > 0 and not want[at(baseline)] and (
            own(baseline) == 0 or _claim_outruns(view, [r.pick for r in regrets], baseline, delta, level)):
        want[at(baseline)] += 1  # no verdict against a baseline with no run at the target, nor one that lags the pick
    return list(want.elements())


def promotions(posterior: Posterior, questions: Sequence[tuple[str, ...]], delta: float, ladder: Sequence[int], epochs: int,
               pending: Mapping[str, int], room: Mapping[str, int], state: tuple[np.ndarray, np.ndarray]) -> dict[str, int]:
    """Successive halving within each question, by the posterior's odds: a configuration whose chance of being
    within `delta` of its question's best at the target is material (MATERIAL), and whose longest run (stored or
    in flight) is short of the target, is promoted one rung up (its longest seed continued), the likeliest first.
    Whether or not its question can be decided: the answer's pick is only as good as the contenders measured."""
    def reached(key: str) -> int:
        return max((e for e in ladder if posterior.n[posterior.index[row_key(key, e)]] + pending.get(row_key(key, e), 0) > 0),
                   default=0)

    chance: dict[str, float] = {}
    for keys in questions:
        cols = [posterior.index[row_key(k, epochs)] for k in keys]
        x = posterior.sign() * posterior.metric_draws(cols, state[0])
        near = np.mean(x.max(axis=1, keepdims=True) - x <= delta, axis=0)
        for k, p in zip(keys, near):
            chance[k] = max(chance.get(k, 0.0), float(p))
    out: dict[str, int] = {}
    for key in sorted(chance, key=lambda k: (-chance[k], k)):
        at = reached(key)
        if chance[key] >= MATERIAL and 0 < at < epochs:
            row = row_key(key, min(e for e in ladder if e > at))
            if room.get(row, 0) > 0:
                out[row] = 1
    return out


def futile(posterior: Posterior, rows: Sequence[str], delta: float, level: float, room: Mapping[str, int],
           state: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether a question cannot be decided under the cap: with each of its measured rows that may still be
    bought and is materially likely within the margin of the best (explorer.voi.MATERIAL) at its cap (`room`,
    imagined at once), its bound stays above the margin."""
    cols = [posterior.index[k] for k in rows]
    x = posterior.sign() * posterior.metric_draws(cols, state[0])
    near = np.mean(x.max(axis=1, keepdims=True) - x <= delta, axis=0)
    extra = {k: room[k] for k, p in zip(rows, near) if room.get(k, 0) > 0 and p >= MATERIAL}
    if not extra:
        return True
    latent, _ = posterior.imagine(extra, *state)
    return posterior.regret(rows, level, latent).eps > delta


def _first_replicates(view: Posterior, questions: Sequence[tuple[str, ...]], measured: set[str], room: Mapping[str, int],
                      batch: int | None, row: object, dof: float) -> list[str]:
    """Too few replicates to weigh a run by (the noise rests on `dof` < MIN_NOISE_DOF degrees of freedom): one
    more seed at the shortest length (the cheapest) of each question's best means, deeper until they bring it
    to MIN_NOISE_DOF (at most `batch`)."""
    out: dict[str, None] = {}
    for depth in range(1, 1 + max(map(len, questions), default=0)):
        for keys in questions:
            top = sorted((k for k in keys if k in measured and room.get(row(k), 0) > 0),  # type: ignore[operator]
                         key=lambda k: -view.sign() * view.raw[view.index[k]] if np.isfinite(view.raw[view.index[k]]) else np.inf)
            out.update(dict.fromkeys(row(k) for k in top[:depth]))  # type: ignore[operator]
        if len(out) >= max(2, MIN_NOISE_DOF - dof):
            break
    return list(out)[:batch] if batch else list(out)


def _claim_outruns(posterior: Posterior, picks: Sequence[str], baseline: str, delta: float, level: float) -> bool:
    """Whether a verdict against the baseline claims something (beats, worse, equivalent, non-inferior)
    for a pick with more seeds than the baseline has: one or two seeds of a noisy baseline made such
    claims false in bench/decide.py's fidelity table (2 of 40 studies at a 1-point margin), so
    the baseline catches up."""
    if baseline not in posterior.index or posterior.n[posterior.index[baseline]] == 0:
        return False
    have = posterior.n[posterior.index[baseline]]
    return any(posterior.n[posterior.index[p]] > have and verdict(posterior, p, baseline, delta, level).kind
               in ("beats", "worse", "equivalent", "non-inferior") for p in dict.fromkeys(picks))
