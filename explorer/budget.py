"""How long and how one trial trains (`budget:` in a study): read by every command, so it imports no torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Compile = Literal["none", "compile", "cudagraphs"]  # how a step runs (explorer.steps)
SPEED_ONLY = {"compile", "seed_batch"}  # budget fields that change how fast a trial runs, not what it measures


class Budget(BaseModel):
    """How long and how one trial trains. The run stops at whichever limit comes first."""

    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(3, ge=1, description="epochs each trial trains")
    max_steps: int | None = Field(None, ge=1, description="at most this many optimizer steps a trial; null: no limit")
    time_limit_s: float | None = Field(None, gt=0, description="at most this many seconds of training a trial; null: no limit")
    batch_size: int = Field(64, ge=1, description="samples per optimizer step")
    lr: float = Field(1e-3, gt=0, description="AdamW's peak learning rate (linear warmup, then cosine decay to 0)")
    weight_decay: float = Field(0.05, ge=0, description="AdamW's weight decay, on matrices only (not on biases and norms)")
    warmup_frac: float = Field(0.1, ge=0, le=1, description="share of the steps over which the learning rate warms up")
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
        it runs (SPEED_ONLY), and `tf32` only when on, so a study stored before it existed keeps its identity."""
        fields = self.model_dump(mode="json", exclude={"seeds", *SPEED_ONLY})
        if not self.tf32:
            del fields["tf32"]
        return fields

    @property
    def seed_list(self) -> list[int]:
        """The replicate seeds, the first of them the one every configuration starts with."""
        if isinstance(self.seeds, list):
            return list(self.seeds)
        return [self.seed + i for i in range(self.seeds or 1)]
