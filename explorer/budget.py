"""How long and how one trial trains (`budget:` in a study): read by every command, so it imports no torch."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Compile = Literal["none", "compile", "cudagraphs"]  # how a step runs (explorer.steps)
SPEED_ONLY = {"compile", "seed_batch"}  # budget fields that change how fast a trial runs, not what it measures


class Budget(BaseModel):
    """How long and how one trial trains. The run stops at whichever limit comes first."""

    model_config = ConfigDict(extra="forbid")

    epochs: int | list[int] = Field(3, description="epochs each trial trains, or a ladder of lengths (`[10, 20, 40]`): each "
                                                   "(configuration, seed, length) is a trial of its own, and under `wsd` a "
                                                   "run of one length gives each shorter rung's result too (explorer.schedule)")
    schedule: Literal["cosine", "wsd"] | None = Field(
        None, description="the learning-rate schedule: `cosine` (linear warmup, cosine decay to 0) or `wsd` "
                          "(warmup-stable-decay, whose shorter rungs branch off at their cooldown); null: cosine for "
                          "one length, wsd for a ladder")
    cooldown: float = Field(0.2, gt=0, lt=1, description="wsd: the share of a run's epochs over which the rate decays to 0")
    max_steps: int | None = Field(None, ge=1, description="at most this many optimizer steps a trial; null: no limit")
    time_limit_s: float | None = Field(None, gt=0, description="at most this many seconds of training a trial; null: no limit")
    batch_size: int = Field(64, ge=1, description="samples per optimizer step")
    lr: float = Field(1e-3, gt=0, description="AdamW's peak learning rate (linear warmup, then the schedule's decay to 0)")
    weight_decay: float = Field(0.05, ge=0, description="AdamW's weight decay, on matrices only (not on biases and norms)")
    warmup_frac: float = Field(0.1, ge=0, le=1, description="share of the steps over which the learning rate warms up (of the shortest rung under wsd)")
    grad_clip: float | None = Field(1.0, gt=0, description="the gradients' global norm is clipped to this; null: no clipping")
    bf16: bool = Field(True, description="autocast to bfloat16, on CUDA only (a CPU trains in float32 and records so: `precision`)")
    tf32: bool = Field(False, description="TF32 for float32 matmuls and convolutions, on CUDA only (explorer.steps.set_tf32); "
                                          "true enters the study's identity")
    compile: Compile = Field("none", description="how a step runs: `none` (eager), `compile` (the forward through torch.compile) "
                                                 "or `cudagraphs` (the whole step as one CUDA graph; eager on a CPU)")
    seed_batch: Literal["auto", "on", "off"] = Field(
        "auto", description="a configuration's queued seeds trained as one model (explorer.seedbatch); `auto` measures "
                            "both ways on the device once per configuration, never on a CPU")
    seed: int = Field(0, description="sets the model's initialisation and the data order")
    # replicates: N seeds (seed, seed+1, ...) or a list of seeds; replicate i of every configuration
    # uses the same seed, so configurations are compared on the same data order (explorer.stats)
    seeds: int | list[int] | None = Field(None, description="replicates: N seeds (`seed`, `seed`+1, ...) or a list of seeds; "
                                                            "null: `seed` alone")

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, value: int | list[int]) -> int | list[int]:
        lengths = value if isinstance(value, list) else [value]
        if not lengths or min(lengths) < 1:
            raise ValueError("lengths of at least one epoch")
        if isinstance(value, list) and lengths != sorted(set(lengths)):
            raise ValueError(f"a ladder of increasing lengths, e.g. [10, 20, 40], not {value}")
        return value

    @property
    def ladder(self) -> list[int]:
        """The lengths (in epochs) the study trains, shortest first."""
        return list(self.epochs) if isinstance(self.epochs, list) else [self.epochs]

    @property
    def longest(self) -> int:
        return self.ladder[-1]

    @property
    def lr_schedule(self) -> Literal["cosine", "wsd"]:
        return self.schedule or ("wsd" if len(self.ladder) > 1 else "cosine")

    def at(self, length: int) -> Budget:
        """The budget of one run `length` epochs long: under wsd it evaluates each rung up to `length` too."""
        if self.ladder == [length]:
            return self
        rungs = [r for r in self.ladder if r <= length] if self.lr_schedule == "wsd" else [length]
        return self.model_copy(update={"epochs": rungs if len(rungs) > 1 else rungs[0], "schedule": self.lr_schedule})

    def compute(self, length: int, after: int | None = None) -> int:
        """Epochs a run of `length` trains: under wsd its length plus each shorter rung's cooldown branch. `after`:
        the run continues the same (configuration, seed)'s run of `after` epochs from that rung's cooldown start
        (explorer.schedule: every run of a seed follows one trajectory until its cooldown), so it pays only the
        epochs past that point and the cooldowns of the rungs in between (10 then 20: 12 epochs, not 22)."""
        from explorer.schedule import cooldown_epochs

        if self.lr_schedule != "wsd":
            return length
        start = 0 if after is None else after - cooldown_epochs(after, self.cooldown)
        between = [r for r in self.ladder if (after or 0) < r < length]
        return length - start + sum(cooldown_epochs(r, self.cooldown) for r in between)

    def continues(self, length: int, runs: Mapping[int, Collection[int]], seeds: Sequence[int]) -> tuple[int, int | None] | None:
        """Which seed a new run of `length` takes, and the length of the stored run it continues from (None:
        from scratch); None when every seed already measures `length`. `runs`: the lengths each seed of the
        configuration has run (stored, queued or running). Under wsd a run measures every rung up to its
        length, and the seed whose longest run is longest continues (the cheapest, and at the target as good
        a replicate as a fresh seed); else, and under cosine, the first seed without it runs from scratch."""
        wsd = self.lr_schedule == "wsd"
        longest = {s: max(runs.get(s, ()), default=0) for s in seeds}
        free = [s for s in seeds if (longest[s] < length if wsd else length not in runs.get(s, ()))]
        if not free:
            return None
        if not wsd:
            return free[0], None
        seed = max(free, key=lambda s: (longest[s], -seeds.index(s)))
        return seed, longest[seed] or None

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: int | list[int] | None) -> int | list[int] | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("at least one seed")
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("a non-empty list of distinct seeds")
        return value

    def identity(self) -> dict[str, Any]:
        """The fields that change what a trial measures (the study's identity): not the seeds, not how fast
        it runs (SPEED_ONLY), and `tf32` and a wsd schedule only when on, so a study stored before they
        existed keeps its identity."""
        fields = self.model_dump(mode="json", exclude={"seeds", "schedule", "cooldown", *SPEED_ONLY})
        if not self.tf32:
            del fields["tf32"]
        if self.lr_schedule == "wsd":  # cosine is what every study stored before schedules existed
            fields.update(schedule="wsd", cooldown=self.cooldown)
        return fields

    @property
    def seed_list(self) -> list[int]:
        """The replicate seeds, the first of them the one every configuration starts with."""
        if isinstance(self.seeds, list):
            return list(self.seeds)
        return [self.seed + i for i in range(self.seeds or 1)]
