"""Pre-norm transformer blocks shared by explorer's own families (nanoGPT-style), and their models.

Every own family is initialised the standard transformer way (`init_weights`, as nanoGPT and timm's
ViT do), so that κ and accuracy compare across families and a tied LM head starts near zero logits.

The only module of the own families that imports torch: a family imports it in `build`. Each block
has a twin counting function in `_counts.py` (`block_params`, `block_flops`), so the families count
a configuration without building it, or importing torch; tests check the two against each other.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from explorer.families._counts import Act, BlockDims, check_heads
from explorer.families._dims import ImageDims, LMDims, SequenceDims


class Attention(nn.Module):
    """Multi-head self-attention. `proj`'s input is the concatenated head outputs (B, N, width)."""

    def __init__(self, width: int, heads: int, bias: bool, causal: bool = False):
        super().__init__()
        check_heads(width, heads)
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`key_mask` (B, N) bool, True where a token may be attended to (padding is False)."""
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class MLP(nn.Module):
    """GELU MLP, or Crammed BERT's GLU: Linear(width, mlp) split in halves a, b -> gelu(a) * b."""

    def __init__(self, width: int, mlp: int, act: Act, bias: bool):
        super().__init__()
        self.act = act
        self.fc1 = nn.Linear(width, mlp, bias=bias)
        self.fc2 = nn.Linear(mlp // 2 if act == "glu" else mlp, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.act == "glu":
            a, b = h.chunk(2, dim=-1)
            return self.fc2(F.gelu(a) * b)
        return self.fc2(F.gelu(h))


class Block(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, mlp: int, act: Act, bias: bool, causal: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=bias)
        self.attn = Attention(width, heads, bias, causal)
        self.ln2 = nn.LayerNorm(width, bias=bias)
        self.mlp = MLP(width, mlp, act, bias)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), key_mask)
        return x + self.mlp(self.ln2(x))


def blocks(d: BlockDims, causal: bool = False) -> nn.ModuleList:
    return nn.ModuleList(Block(d.width, d.heads, d.mlp, d.act, d.bias, causal) for _ in range(d.layers))


INIT_STD = 0.02  # GPT-2 / nanoGPT / timm ViT


def init_weights(model: nn.Module, layers: int) -> None:
    """Standard transformer init: Linear and Embedding weights N(0, 0.02), biases 0, LayerNorm 1/0,
    and the residual output projections (attention `proj`, MLP `fc2`) N(0, 0.02 / sqrt(2 * layers)),
    so the residual stream's variance does not grow with depth (nanoGPT, GPT-2). Convolutions
    (the image patch embedding) keep PyTorch's default, as timm's ViT does. A head tied to the token
    embedding shares its N(0, 0.02) weights, so a fresh LM's logits are near zero (loss near ln vocab).
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, Block):
            for residual_out in (module.attn.proj, module.mlp.fc2):
                nn.init.normal_(residual_out.weight, 0.0, INIT_STD / math.sqrt(2 * layers))


class ImageEncoder(nn.Module):
    """`image-encoder`: patch embedding, class token or mean pool, blocks, linear head.
    Standard transformer init (`init_weights`); position embedding N(0, 0.02), class token 0."""

    def __init__(self, d: ImageDims):
        super().__init__()
        self.patch_embed = nn.Conv2d(d.in_chans, d.width, d.patch, stride=d.patch, bias=d.bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d.width)) if d.pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.randn(1, d.tokens(), d.width) * 0.02)
        self.blocks = blocks(d)
        self.norm = nn.LayerNorm(d.width, bias=d.bias)
        self.head = nn.Linear(d.width, d.num_classes, bias=d.bias)
        init_weights(self, d.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
        x = x + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.cls_token is not None else x.mean(dim=1))


class SequenceClassifier(nn.Module):
    """`sequence-classifier` and `crammed-bert`. Token 0 is padding: attention ignores padded keys and
    mean pooling skips them. Standard transformer init (`init_weights`); position embedding N(0, 0.02),
    class token 0.
    """

    def __init__(self, d: SequenceDims):
        super().__init__()
        self.tok_embed = nn.Embedding(d.vocab, d.width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d.width)) if d.pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.randn(1, d.tokens(), d.width) * 0.02)
        self.blocks = blocks(d)
        self.norm = nn.LayerNorm(d.width, bias=d.bias)
        self.head = nn.Linear(d.width, d.num_classes, bias=d.bias)
        init_weights(self, d.layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != 0
        x = self.tok_embed(ids)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
            keep = torch.cat([keep.new_ones(len(x), 1), keep], dim=1)
        else:
            keep = keep.clone()
            keep[:, 0] = True  # an all-padding row would give attention nothing to attend to
        x = x + self.pos_embed[:, : x.shape[1]]
        for block in self.blocks:
            x = block(x, keep)
        x = self.norm(x)
        if self.cls_token is not None:
            return self.head(x[:, 0])
        w = keep.unsqueeze(-1).to(x.dtype)
        return self.head((x * w).sum(1) / w.sum(1))


class CausalLM(nn.Module):
    """`causal-lm`, token ids (B, T) -> next-token logits (B, T, vocab). Standard transformer init
    (`init_weights`): a fresh model's loss is near ln(vocab), tied or not."""

    def __init__(self, d: LMDims):
        super().__init__()
        self.tok_embed = nn.Embedding(d.vocab, d.width)
        self.pos_embed = nn.Parameter(torch.randn(1, d.seq_len, d.width) * 0.02)
        self.blocks = blocks(d, causal=True)
        self.norm = nn.LayerNorm(d.width, bias=d.bias)
        self.head = nn.Linear(d.width, d.vocab, bias=False)
        if d.tie_weights:
            self.head.weight = self.tok_embed.weight
        init_weights(self, d.layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_embed(ids) + self.pos_embed[:, : ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
