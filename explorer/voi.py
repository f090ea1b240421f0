"""Value of information: what more runs would do to the regret bounds, imagined on the posterior's draws
(explorer.posterior.Posterior.imagine: the spread after a run, the mean held). The seed policy
(explorer.decisions.next_seeds) and the advice for an undecided budget (`seeds_to_decide`) read it.

A run is judged by the questions whose contenders it is among (its effect on the others, through the
surface, is second order and left out); with several lengths a contender's run may be bought at any
length of the ladder, judged by the shrinkage of the bounds at the target length per second of training
(the posterior's `cost`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from explorer.posterior import LEVEL, Posterior, subset
from explorer.rows import row_key, split_row

CONTENDER = 0.005  # share of draws in which a configuration is the best that makes it matter to a bound
MATERIAL = 0.05  # chance of being within delta of the best that makes a configuration worth a run (successive halving)
OPTIONS = 8  # configurations the policy weighs per run: those of an undecided question likeliest within delta of its best
ADVICE_CAP = 60  # seeds the advice for an undecided budget looks through


def _contenders(posterior: Posterior, keys: Sequence[str], latent: np.ndarray, delta: float) -> tuple[tuple[str, ...], dict[str, float]]:
    """The configurations of `keys` that are the best in at least CONTENDER of the draws (the regret of
    any pick is, but for those few draws, over these), and each one's chance of being within `delta` of the
    best (those at least MATERIAL: the ones a run may be spent on)."""
    cols = [posterior.index[k] for k in keys]
    x = posterior.sign() * posterior.metric_draws(cols, latent)
    share = np.bincount(np.argmax(x, axis=1), minlength=len(keys)) / len(x)
    near = np.mean(x.max(axis=1, keepdims=True) - x <= delta, axis=0)
    keep = [i for i, s in enumerate(share) if s >= CONTENDER] or [int(np.argmax(share))]
    return tuple(keys[i] for i in keep), {keys[i]: float(near[i]) for i in range(len(keys)) if near[i] >= MATERIAL}


def greedy(posterior: Posterior, sets: Sequence[tuple[str, ...]], delta: float, level: float,
           room: Mapping[str, int], steps: int, repeat: bool, ladder: Sequence[int] = (),
           state: tuple[np.ndarray, np.ndarray] | None = None, goal: float | None = None) -> tuple[dict[str, int], bool]:
    """Runs one at a time where the summed excess of the bounds over `goal` (default `delta`) shrinks most per
    second, imagining each (one per row unless `repeat`: then as many as its `room`, each a distinct seed);
    (runs per row, whether every bound reached the goal). A run is judged by the questions whose contenders it
    is among (its effect on the others, through the surface, is second order and left out), and only a
    configuration whose chance of being within delta of its question's best is material (MATERIAL) gets one:
    successive halving, by the posterior's odds rather than by rank. With a `ladder` the questions hold rows at
    one length and a contender's run may be bought at any length of it, at its price (`cost`: a continued run
    pays only its extra epochs). `state`: the imagined (latent draws, covariance) to start from (runs in flight)."""
    goal = delta if goal is None else goal
    start = posterior.latent_draws if state is None else state[0]
    found = [_contenders(posterior, s, start, delta) for s in sets]
    near: dict[str, float] = {}
    for _, chances in found:
        for k, v in chances.items():
            near[k] = max(near.get(k, 0.0), v)
    sets = [tuple(dict.fromkeys(keys + (posterior.regret(s, level, start).pick,))) for (keys, _), s in zip(found, sets)]
    worth = [set(chances) for _, chances in found]

    def runs(k: str) -> list[str]:  # the rows a run of k's configuration can be bought at
        return [row_key(split_row(k)[0], e) for e in ladder if row_key(split_row(k)[0], e) in posterior.index] or [k]

    price = dict(zip(posterior.keys, posterior.cost)) if ladder and posterior.cost is not None else {}
    keep = list(dict.fromkeys([*(k for s in sets for k in s), *(o for s in worth for k in s for o in runs(k))]))
    cols = [posterior.index[k] for k in keep]
    posterior = subset(posterior, keep)
    latent, cov = (posterior.latent_draws, posterior.latent_cov) if state is None else \
        (state[0][:, cols], state[1][np.ix_(cols, cols)])
    rng = np.random.default_rng(posterior.seed + 7)
    chosen: dict[str, int] = {}
    left = dict(room)

    def excess(i: int, draws: np.ndarray) -> float:
        return max(posterior.regret(sets[i], level, draws).eps - goal, 0.0)

    now = [excess(i, latent) for i in range(len(sets))]
    for _ in range(steps):
        if sum(now) <= 0:
            return chosen, True
        open_ = {k for i, s in enumerate(worth) if now[i] > 0 for k in s}
        by_chance = sorted(open_, key=lambda k: (-near.get(k, 0.0), k))  # the OPTIONS likeliest within delta of the best
        buyable = [k for k in by_chance if any(left.get(o, 0) > 0 and (repeat or o not in chosen) for o in runs(k))]
        options = sorted(o for k in buyable[:OPTIONS] for o in runs(k) if left.get(o, 0) > 0 and (repeat or o not in chosen))
        best, best_value, best_state, best_after = None, 0.0, None, now
        step = int(rng.integers(1 << 31))  # one draw of the imagined seed's noise for every option: their gains compare
        for key in options:
            imagined = posterior.imagine({key: 1}, latent, cov, np.random.default_rng(step))
            mine = set(runs(key))
            after = [excess(i, imagined[0]) if mine & (set(s) | worth[i]) and now[i] > 0 else now[i] for i, s in enumerate(sets)]
            value = (sum(now) - sum(after)) / price.get(key, 1.0)
            if value > best_value + 1e-12:
                best, best_value, best_state, best_after = key, value, imagined, after
        if best is None or best_state is None:
            break
        latent, cov = best_state
        chosen[best] = chosen.get(best, 0) + 1
        left[best] -= 1
        now = best_after
    return chosen, sum(now) <= 0


def seeds_to_decide(posterior: Posterior, keys: Sequence[str], delta: float, level: float = LEVEL,
                    room: Mapping[str, int] | None = None, cap: int = ADVICE_CAP,
                    ladder: Sequence[int] = ()) -> tuple[dict[str, int], bool]:
    """Which measured configurations of `keys`, and how many more seeds each, would bring the bound to
    `delta` (imagined, greedily; with a `ladder`, runs of `keys`' configurations at any of its lengths,
    those measured at some length); (advice, reached) with `reached` False past `cap` seeds."""
    if not posterior.has_intervals:
        top = sorted((k for k in keys if k in posterior.index), key=lambda k: -posterior.sign() * posterior.raw[posterior.index[k]])
        return {k: 1 for k in [k for k in top if (room or {}).get(k, 1) > 0][:2]}, False
    if ladder:
        known = {split_row(k)[0] for k, n in zip(posterior.keys, posterior.n) if n > 0}
        rows = [row_key(split_row(k)[0], e) for k in keys if split_row(k)[0] in known for e in ladder]
        measured = {r: (room or {}).get(r, cap) for r in rows if r in posterior.index}
    else:
        measured = {k: (room or {}).get(k, cap) for k in keys if posterior.n[posterior.index[k]] > 0}
    return greedy(posterior, [tuple(keys)], delta, level, measured, cap, repeat=True, ladder=ladder)
