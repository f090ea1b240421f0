"""Long-Range Arena ListOps, generated in process by a faithful port of LRA's generator.

Source: google-research/long-range-arena, `lra_benchmarks/data/listops.py` (Tay et al., 2021,
after Nangia & Bowman, 2018). As there: a node below `max_depth` becomes an operator with
probability 0.25 (always a digit at `max_depth`), an operator takes `randint(2, max_args)`
arguments and is one of MIN, MAX, MED (`int(np.median)`), SM (sum mod 10); trees are kept when
`min_length < length < max_length` (length counts operators, digits and `]`), duplicates dropped,
and the first `n_train` distinct trees are the train split, the next `n_eval` the eval split.

Two deliberate differences: we draw from `random.Random(seed)` and keep trees in generation order
(LRA fills a Python `set`, whose order changes with the interpreter's hash seed), so a seed always
gives the same data; and the tokens keep `]` and the operators (LRA's tfds tokenizer silently drops
brackets and keeps `MIN`...). Ids: 0 pad, 1-10 digits 0-9, 11-14 `[MIN [MAX [MED [SM`, 15 `]`;
no CLS token (the classifier pools). Sequences are right-padded to `seq_len = max_length`.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import TYPE_CHECKING, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from explorer.tasks import Task, register

if TYPE_CHECKING:
    import torch

    from explorer.tasks import TaskData

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUE_P = 0.25  # LRA's probability that a node above max_depth is an operator
VOCAB = ["<pad>", *(str(v) for v in range(10)), *OPERATORS, END]
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
MAX_TRIES_PER_SAMPLE = 1000  # give up, rather than loop forever, when the filter keeps almost nothing

# LRA's tree: ((((op, a1), a2), ...), "]") -- left-nested pairs, as its to_string/to_value expect.
Tree = Union[int, str, tuple["Tree", "Tree"]]


class ListOpsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # frozen: hashable, so generation is cached
    n_train: int = Field(2000, ge=1, description="distinct expressions in the training split")
    n_eval: int = Field(500, ge=1, description="distinct expressions in the evaluation split")
    max_depth: int = Field(4, ge=2, description="deepest nesting of operators")
    max_args: int = Field(10, ge=2, description="most arguments of one operator")
    min_length: int = Field(16, ge=0, description="kept expressions are longer than this, in tokens")
    max_length: int = Field(128, ge=3, description="kept expressions are shorter than this, in tokens; also the padded "
                                                   "sequence length")
    seed: int = Field(0, description="the generator's seed: the same seed, the same data")

    @model_validator(mode="after")
    def _lengths(self) -> "ListOpsOptions":
        if self.min_length + 1 >= self.max_length:
            raise ValueError(f"min_length ({self.min_length}) must be below max_length - 1 ({self.max_length - 1})")
        return self


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[Tree, int]:
    """One random expression and its length in tokens (LRA's `generate_tree`)."""
    r = rng.random() if depth < max_depth else 1
    if r > VALUE_P:
        return rng.choice(range(10)), 1
    length = 2
    values = []
    for _ in range(rng.randint(2, max_args)):
        sub, sub_len = generate_tree(rng, depth + 1, max_depth, max_args)
        values.append(sub)
        length += sub_len
    tree: Tree = (rng.choice(OPERATORS), values[0])
    for value in values[1:]:
        tree = (tree, value)
    return (tree, END), length


def tokens(tree: Tree) -> list[str]:
    """The expression's tokens in order (LRA's `to_string` without its parentheses)."""
    if not isinstance(tree, tuple):
        return [str(tree)]
    return tokens(tree[0]) + tokens(tree[1])


def value(tree: Tree) -> int:
    """The expression's value, 0-9 (LRA's `to_value`)."""
    return _evaluate(tree)  # type: ignore[return-value]


def _evaluate(tree: Tree) -> int | str | tuple[str, list[int]]:
    if not isinstance(tree, tuple):
        return tree
    left, right = _evaluate(tree[0]), _evaluate(tree[1])
    if left in OPERATORS:  # an operator meets its first argument
        return (left, [right])  # type: ignore[list-item]
    op, args = left  # type: ignore[misc]
    if right != END:  # one more argument
        return (op, args + [right])
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:
        return int(np.median(args))
    return sum(args) % 10


@lru_cache(maxsize=4)
def _generate(options: ListOpsOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) for the first n_train + n_eval distinct accepted trees: x (N, max_length) ids, y (N,)."""
    import torch

    o = options
    rng = random.Random(o.seed)
    wanted = o.n_train + o.n_eval
    kept: dict[Tree, None] = {}
    for _ in range(wanted * MAX_TRIES_PER_SAMPLE):
        tree, length = generate_tree(rng, 1, o.max_depth, o.max_args)
        if o.min_length < length < o.max_length:
            kept[tree] = None
            if len(kept) == wanted:
                break
    else:
        raise ValueError(
            f"only {len(kept)} of {wanted} distinct expressions with {o.min_length} < length < {o.max_length} "
            f"after {wanted * MAX_TRIES_PER_SAMPLE} draws; widen the lengths or raise max_depth/max_args"
        )
    x = torch.zeros(wanted, o.max_length, dtype=torch.long)
    y = torch.empty(wanted, dtype=torch.long)
    for i, tree in enumerate(kept):
        ids = [TOKEN_ID[t] for t in tokens(tree)]
        x[i, : len(ids)] = torch.tensor(ids)
        y[i] = value(tree)
    return x, y


@register
class ListOps(Task):
    name = "listops"
    modality = "sequence"
    metric = "accuracy"
    higher_is_better = True
    Options = ListOpsOptions

    def dims(self) -> dict[str, int]:
        return {"vocab": len(VOCAB), "seq_len": self.options.max_length, "num_classes": 10}

    def load(self, batch_size: int, seed: int) -> TaskData:
        from explorer.tasks import tensor_data

        try:
            x, y = _generate(self.options)
        except ValueError as err:
            raise self.error(str(err)) from None
        n = self.options.n_train
        return tensor_data((x[:n], y[:n]), (x[n:], y[n:]), batch_size, seed)
