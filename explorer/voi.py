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

CONTENDER = 0.005  # share of draws in which a configuration is the best that makes it matter to the seed policy
OPTIONS = 8  # configurations the seed policy weighs per seed: those most often the best of an undecided question
ADVICE_CAP = 60  # seeds the advice for an undecided budget looks through


def _contenders(posterior: Posterior, keys: Sequence[str], latent: np.ndarray) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The configurations of `keys` that are the best in at least CONTENDER of the draws (the regret of
    any pick is, but for those few draws, over these), and those shares."""
    cols = [posterior.index[k] for k in keys]
    x = posterior.sign() * posterior.metric_draws(cols, latent)
    share = np.bincount(np.argmax(x, axis=1), minlength=len(keys)) / len(x)
    keep = [i for i, s in enumerate(share) if s >= CONTENDER] or [int(np.argmax(share))]
    return tuple(keys[i] for i in keep), tuple(float(share[i]) for i in keep)


def greedy(posterior: Posterior, sets: Sequence[tuple[str, ...]], delta: float, level: float,
            room: Mapping[str, int], steps: int, repeat: bool, ladder: Sequence[int] = ()) -> tuple[dict[str, int], bool]:
    """Seeds one at a time where the summed excess of the bounds over delta shrinks most, imagining each
    (one per configuration unless `repeat`); (seeds per configuration, whether every bound reached delta).
    A seed is judged by the questions whose contenders it is among (its effect on the others, through
    the surface, is second order and left out). With a `ladder` the questions hold rows at one length and
    a contender's run may be bought at any length of it, judged by the shrinkage per second (`cost`)."""
    found = [_contenders(posterior, s, posterior.latent_draws) for s in sets]
    share: dict[str, float] = {}
    for keys, shares in found:
        for k, v in zip(keys, shares):
            share[k] = share.get(k, 0.0) + v
    sets = [tuple(dict.fromkeys(keys + (posterior.regret(s, level).pick,))) for (keys, _), s in zip(found, sets)]

    def runs(k: str) -> list[str]:  # the rows a run of k's configuration can be bought at
        return [row_key(split_row(k)[0], e) for e in ladder if row_key(split_row(k)[0], e) in posterior.index] or [k]

    price = dict(zip(posterior.keys, posterior.cost)) if ladder and posterior.cost is not None else {}
    posterior = subset(posterior, list(dict.fromkeys([*(k for s in sets for k in s), *(o for s in sets for k in s for o in runs(k))])))
    latent, cov = posterior.latent_draws, posterior.latent_cov
    rng = np.random.default_rng(posterior.seed + 7)
    chosen: dict[str, int] = {}
    left = dict(room)

    def excess(i: int, draws: np.ndarray) -> float:
        return max(posterior.regret(sets[i], level, draws).eps - delta, 0.0)

    now = [excess(i, latent) for i in range(len(sets))]
    for _ in range(steps):
        if sum(now) <= 0:
            return chosen, True
        open_ = {k for i, s in enumerate(sets) if now[i] > 0 for k in s}
        by_share = sorted(open_, key=lambda k: (-share.get(k, 0.0), k))  # the OPTIONS contenders most often the best
        buyable = [k for k in by_share if any(left.get(o, 0) > 0 and (repeat or o not in chosen) for o in runs(k))]
        options = sorted(o for k in buyable[:OPTIONS] for o in runs(k) if left.get(o, 0) > 0 and (repeat or o not in chosen))
        best, best_value, best_state, best_after = None, 0.0, None, now
        step = int(rng.integers(1 << 31))  # one draw of the imagined seed's noise for every option: their gains compare
        for key in options:
            state = posterior.imagine({key: 1}, latent, cov, np.random.default_rng(step))
            mine = set(runs(key))
            after = [excess(i, state[0]) if mine & set(s) and now[i] > 0 else now[i] for i, s in enumerate(sets)]
            value = (sum(now) - sum(after)) / price.get(key, 1.0)
            if value > best_value + 1e-12:
                best, best_value, best_state, best_after = key, value, state, after
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
