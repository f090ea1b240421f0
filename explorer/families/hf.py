"""Adapters onto Hugging Face `transformers`: GPT-2, BERT for sequence classification, a Llama decoder.

The only module in explorer that imports transformers, and only when a model is built (it is an
optional extra: `pip install 'explorer[hf]'`; without it `get_family` says so in one line). Models
are built from a config, never downloaded, with transformers' own initialisation (normal 0.02;
GPT-2 also scales its residual projections by 1/sqrt(2 layers)). Counting is closed form and
needs no transformers; tests check every count against the built model's `sum(p.numel())` and
every FLOP count against torch's FlopCounterMode.

explorer's dimensions map onto each config: `layers`, `heads`, `width`, `mlp` are the depth, the
attention heads, the hidden size and the MLP's inner size; `vocab` the vocabulary; `seq_len` the
learned positions (GPT-2, BERT) or the rotary context (Llama). Unset dimensions take transformers'
own config defaults (GPT-2 small, BERT-base, Llama-2-7B).

κ: each attention block's output projection (`c_proj`, `attention.output.dense`, `o_proj`) takes
the concatenated heads' outputs, as `proj` does in explorer's own and timm's attention modules, so
the adapter names it `proj` on the attention module (a plain attribute: no second copy in the
state dict) and `explorer.conditioning` hooks it unchanged. The attention backend is pinned by the
`attn` dimension (`sdpa` by default, `eager` too); both give the same κ (tested), since the
projection's input is the same matrix whichever kernel computed it.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from explorer.families import Dims, Family, register
from explorer.families._counts import check_heads

Backend = Literal["sdpa", "eager"]
REQUIRES = ("transformers", "hf")


class HFDims(BaseModel):
    """What every transformers family shares; `dropout` (0: explorer's short runs use none) sets
    every dropout probability of the config, `attn` the attention backend."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(12, ge=1, description="`n_layer` / `num_hidden_layers`")
    heads: int = Field(12, ge=1, description="`n_head` / `num_attention_heads`; they divide the width")
    width: int = Field(768, ge=1, description="`n_embd` / `hidden_size`")
    mlp: int = Field(3072, ge=1, description="`n_inner` / `intermediate_size`")
    vocab: int = Field(50257, ge=2, description="`vocab_size` (the task fixes it)")
    seq_len: int = Field(1024, ge=1, description="positions, or Llama's rotary context (the task fixes it)")
    dropout: float = Field(0.0, ge=0, lt=1, description="every dropout probability of the config")
    attn: Backend = Field("sdpa", description="the attention backend, `sdpa` or `eager` (the same κ)")

    @model_validator(mode="after")
    def _heads_fit(self) -> "HFDims":
        check_heads(self.width, self.heads)
        return self


class GPT2Dims(HFDims):
    """GPT2Config's defaults: GPT-2 small, its LM head tied to the token embedding."""

    tie_weights: bool = Field(True, description="the LM head shares the token embedding's weights")


class BertDims(HFDims):
    """BertConfig's defaults: BERT-base, vocab 30522, 512 positions; two token types, a pooler and
    a classification head of `num_classes`. Token id 0 is padding (attention ignores it)."""

    vocab: int = Field(30522, ge=2)
    seq_len: int = Field(512, ge=1)
    num_classes: int = Field(2, ge=1, description="classes of the classification head (the task fixes it)")


class LlamaDims(HFDims):
    """LlamaConfig's defaults: Llama-2-7B (32 layers, 32 heads, hidden 4096, SwiGLU 11008, vocab
    32000, context 2048, untied head). `kv_heads` is the number of key/value heads (grouped-query
    attention): a number that divides `heads`, or `heads` (the default: one per query head)."""

    layers: int = Field(32, ge=1)
    heads: int = Field(32, ge=1)
    kv_heads: int | Literal["heads"] = Field("heads", description="key/value heads (grouped-query attention): a "
                                                                   "number that divides `heads`, or `heads` (one per query head)")
    width: int = Field(4096, ge=1)
    mlp: int = Field(11008, ge=1)
    vocab: int = Field(32000, ge=2)
    seq_len: int = Field(2048, ge=1)
    tie_weights: bool = Field(False, description="the LM head shares the token embedding's weights")

    @model_validator(mode="after")
    def _groups_fit(self) -> "LlamaDims":
        kv = self.kv
        if kv < 1 or self.heads % kv:
            raise ValueError(f"kv_heads {kv} must divide heads {self.heads}")
        return self

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads == "heads" else self.kv_heads


class Adapter(nn.Module):
    """A transformers model behind explorer's interface: token ids (B, T) in, a logits tensor out.

    `blocks` lists each layer's (attention module, output projection); the projection is named
    `proj` on its attention module for `explorer.conditioning`. `pad_id` (classifiers) builds the
    attention mask: padded keys are ignored.
    """

    def __init__(self, net: nn.Module, blocks: list[tuple[nn.Module, nn.Module]], pad_id: int | None = None):
        super().__init__()
        self.net, self.pad_id = net, pad_id
        for attention, projection in blocks:
            object.__setattr__(attention, "proj", projection)  # an alias, not a registered submodule

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = None if self.pad_id is None else (ids != self.pad_id).long()
        return self.net(input_ids=ids, attention_mask=mask).logits


class HFFamily(Family):
    """Shared by the three: the optional package they need, and `build` = validate the dims, then `_build`."""

    requires = REQUIRES
    counting = "closed-form"

    def build(self, dims: Dims) -> nn.Module:
        return self._build(self.check(dims))

    @abstractmethod
    def _build(self, d: Any) -> nn.Module:
        """The adapted transformers model for validated dims `d` (imports transformers)."""


def _common(d: HFDims) -> dict[str, Any]:
    return {"vocab_size": d.vocab, "use_cache": False, "attn_implementation": d.attn}


def _decoder_flops(d: HFDims, qkv_out: int, mlp_matrices: int) -> int:
    """Layers of attention (q/k/v with `qkv_out` outputs, then o) and an MLP of `mlp_matrices`
    width x mlp matrices on seq_len tokens, the full attention square, and the LM head."""
    t, w = d.seq_len, d.width
    per_layer = 2 * t * (w * qkv_out + w * w + mlp_matrices * w * d.mlp) + 4 * t * t * w
    return d.layers * per_layer + 2 * t * w * d.vocab


@register
class GPT2Family(HFFamily):
    """transformers' GPT2LMHeadModel: n_layer, n_head, n_embd, n_inner, vocab_size, n_positions.
    Counting (closed form): token and position embeddings (vocab + seq_len) * width; per layer two
    LayerNorms (4 width), c_attn width*3width + 3width, c_proj width^2 + width, c_fc width*mlp + mlp,
    c_proj mlp*width + width; final LayerNorm; the LM head only when untied (tied: counted once).
    GPT-2 small is 124,439,808. FLOPs: the matmuls on seq_len tokens (full attention square) and
    the head."""

    name = "hf-gpt2"
    modality = "lm"
    Dims = GPT2Dims

    def params(self, dims: Dims) -> int:
        d = self.check(dims)
        w, m = d.width, d.mlp
        layer = 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (w * m + m) + (m * w + w)
        return d.vocab * w * (1 if d.tie_weights else 2) + d.seq_len * w + d.layers * layer + 2 * w

    def flops(self, dims: Dims) -> int:
        d = self.check(dims)
        return _decoder_flops(d, 3 * d.width, mlp_matrices=2)

    def _build(self, d: GPT2Dims) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=d.layers, n_head=d.heads, n_embd=d.width, n_inner=d.mlp, n_positions=d.seq_len,
            tie_word_embeddings=d.tie_weights, resid_pdrop=d.dropout, embd_pdrop=d.dropout, attn_pdrop=d.dropout,
            bos_token_id=d.vocab - 1, eos_token_id=d.vocab - 1, **_common(d),
        )
        net = GPT2LMHeadModel(config)
        return Adapter(net, [(block.attn, block.attn.c_proj) for block in net.transformer.h])


@register
class BertFamily(HFFamily):
    """transformers' BertForSequenceClassification: num_hidden_layers, num_attention_heads,
    hidden_size, intermediate_size, vocab_size, max_position_embeddings, num_labels. Counting
    (closed form): word, position (seq_len) and two token-type embeddings, their LayerNorm; per layer
    query/key/value/output dense 4(width^2 + width), intermediate width*mlp + mlp, output
    mlp*width + width, two LayerNorms; the pooler width^2 + width; the classifier
    width*num_classes + num_classes. FLOPs: the layers on seq_len tokens, the pooler on the first
    token, the classifier."""

    name = "hf-bert"
    modality = "sequence"
    Dims = BertDims

    def params(self, dims: Dims) -> int:
        d = self.check(dims)
        w, m = d.width, d.mlp
        embeddings = (d.vocab + d.seq_len + 2) * w + 2 * w
        layer = 4 * (w * w + w) + (w * m + m) + (m * w + w) + 4 * w
        return embeddings + d.layers * layer + (w * w + w) + (w * d.num_classes + d.num_classes)

    def flops(self, dims: Dims) -> int:
        d = self.check(dims)
        t, w = d.seq_len, d.width
        layer = 2 * t * (4 * w * w + 2 * w * d.mlp) + 4 * t * t * w
        return d.layers * layer + 2 * w * w + 2 * w * d.num_classes

    def _build(self, d: BertDims) -> nn.Module:
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            num_hidden_layers=d.layers, num_attention_heads=d.heads, hidden_size=d.width, intermediate_size=d.mlp,
            max_position_embeddings=d.seq_len, num_labels=d.num_classes, pad_token_id=0,
            hidden_dropout_prob=d.dropout, attention_probs_dropout_prob=d.dropout, classifier_dropout=d.dropout,
            **_common(d),
        )
        net = BertForSequenceClassification(config)
        return Adapter(net, [(layer.attention, layer.attention.output.dense) for layer in net.bert.encoder.layer], pad_id=0)


@register
class LlamaFamily(HFFamily):
    """transformers' LlamaForCausalLM with grouped-query attention: num_hidden_layers,
    num_attention_heads, num_key_value_heads (`kv_heads`), hidden_size, intermediate_size,
    vocab_size, max_position_embeddings. Counting (closed form, no biases): token embedding
    vocab*width; per layer q and o width^2, k and v width*kv_heads*head_dim each, SwiGLU
    3*width*mlp, two RMSNorms (2 width); the final RMSNorm; the LM head only when untied. Rotary
    positions have no parameters. FLOPs: the matmuls on seq_len tokens (full attention square) and
    the head; not the rotary angle table (head_dim * seq_len, a matmul before transformers 5)."""

    name = "hf-llama"
    modality = "lm"
    Dims = LlamaDims

    def params(self, dims: Dims) -> int:
        d = self.check(dims)
        w, kv_width = d.width, d.kv * (d.width // d.heads)
        layer = 2 * w * w + 2 * w * kv_width + 3 * w * d.mlp + 2 * w
        return d.vocab * w * (1 if d.tie_weights else 2) + d.layers * layer + w

    def flops(self, dims: Dims) -> int:
        d = self.check(dims)
        return _decoder_flops(d, d.width + 2 * d.kv * (d.width // d.heads), mlp_matrices=3)  # SwiGLU: gate, up, down

    def _build(self, d: LlamaDims) -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            num_hidden_layers=d.layers, num_attention_heads=d.heads, num_key_value_heads=d.kv, hidden_size=d.width,
            intermediate_size=d.mlp, max_position_embeddings=d.seq_len, tie_word_embeddings=d.tie_weights,
            attention_dropout=d.dropout, bos_token_id=None, eos_token_id=None, pad_token_id=None, **_common(d),
        )
        net = LlamaForCausalLM(config)
        return Adapter(net, [(layer.self_attn, layer.self_attn.o_proj) for layer in net.model.layers])

