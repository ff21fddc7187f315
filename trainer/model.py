"""A GPT-style decoder. Attention goes through torch's scaled_dot_product_attention with
`is_causal=True`: on CUDA that selects the flash kernel, on CPU torch's own flash kernel.
Attention dropout stays 0, since dropout sends SDPA to the slow math kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from spotrain.trainer.config import GPTConfig

Recompute = Callable[[nn.Module, torch.Tensor], torch.Tensor]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=False)
        self.out = nn.Linear(config.width, config.width, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for t in (q, k, v))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        return self.dropout(self.out(y.transpose(1, 2).reshape(batch, length, width)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width)
        self.attention = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width, bias=False),
            nn.GELU(),
            nn.Linear(4 * config.width, config.width, bias=False),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, *, recompute: Recompute | None = None) -> None:
        """`recompute` runs a block as `recompute(block, x)` while training, recomputing its
        activations in the backward pass instead of keeping them (activation checkpointing,
        e.g. DeepSpeed's `deepspeed.checkpointing.checkpoint`); None keeps them."""
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("model.vocab_size is not known yet: take it from the data first")
        self.config, self.recompute = config, recompute
        self.tokens = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied: fewer parameters, better small models
        self.apply(self._init)
        # Scaled init of residual projections (GPT-2): keeps the residual stream's variance flat.
        for name, parameter in self.named_parameters():
            if name.endswith(("attention.out.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * config.layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or the mean cross-entropy when `targets` are given."""
        length = tokens.shape[1]
        if length > self.config.context:
            raise ValueError(
                f"sequence of {length} tokens is longer than context {self.config.context}"
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        recompute = self.recompute if torch.is_grad_enabled() else None
        for block in self.blocks:
            x = block(x) if recompute is None else recompute(block, x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
