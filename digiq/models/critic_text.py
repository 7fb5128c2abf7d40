"""The critic's text encoders, trained with its heads: the goal, an action's type and its typed text.

Released Digi-Q's critic reads the goal, the previous action's type and
typed text and the scored action's type and typed text through three
RoBERTa encoders (one for goals, one for action types, one for typed texts;
the type and text encoders read the previous action and the scored one
alike) and trains all three with its Q and V heads by the same TD loss.
Here each tower starts as a copy of the base policy's T5 encoder (nothing is
downloaded; with the released checkpoint that is AutoUI's), its states
averaged over each text's tokens and pooled as RoBERTa's pooler pools, by a
dense layer and tanh; the dense layer starts as the identity, so an untrained
tower gives tanh of the frozen average the critic read before
(:meth:`~digiq.models.policy.AutoUIPolicy.text_features`).

Texts repeat a lot (an action type is one of a few words, a goal stands for
every step of its episodes), so every text is tokenized once into a table
(:class:`TextTable`) and a batch encodes each distinct text it holds once.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase, T5Config, T5EncoderModel

from digiq.models.policy import use_fused_gelu

__all__ = ["TOWERS", "TextTable", "TextTower", "TextTowers", "encoder_stack", "vocabulary_digest"]

# The critic's towers, as released: goals; action types; typed texts (an action that does not parse is its own
# text for both, digiq.models.critic_inputs.action_text).
TOWERS = ("goal", "action_type", "typed_text")


@dataclass(frozen=True)
class TextTable:
    """Every distinct text a critic reads, tokenized once: ``ids`` and ``mask`` (T, L), right-padded; texts are
    referred to by their row."""

    texts: tuple[str, ...]
    ids: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def of(cls, texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> TextTable:
        """The table of ``texts`` (each once, in order of first appearance), tokenized as the base policy
        tokenizes its prompts, each cut to its last ``max_tokens``."""
        distinct = tuple(dict.fromkeys(texts))
        side, tokenizer.truncation_side = tokenizer.truncation_side, "left"  # as released: a long text keeps its end
        try:
            enc = tokenizer(list(distinct), padding=True, padding_side="right", truncation=True, max_length=max_tokens,
                            return_tensors="pt")  # fmt: skip
        finally:
            tokenizer.truncation_side = side
        return cls(distinct, enc["input_ids"], enc["attention_mask"])

    def rows(self, texts: Sequence[str]) -> torch.Tensor:
        """The table's row of each of ``texts``; a text it does not hold is named."""
        at = {text: i for i, text in enumerate(self.texts)}
        missing = [t for t in texts if t not in at]
        if missing:
            raise KeyError(f"{len(missing)} text(s) not in the critic's text table, e.g. {missing[0]!r}")
        return torch.tensor([at[t] for t in texts], dtype=torch.long)


class TextTower(nn.Module):
    """One encoder: a T5 encoder stack, its states averaged over each text's tokens, then dense + tanh."""

    def __init__(self, stack: nn.Module, d_model: int) -> None:
        super().__init__()
        self.stack = stack
        self.pool = nn.Linear(d_model, d_model)
        with torch.no_grad():  # the identity: an untrained tower pools the frozen average, squashed
            self.pool.weight.copy_(torch.eye(d_model))
            self.pool.bias.zero_()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(U, d_model) for U texts' token ``ids`` and ``mask`` (U, L)."""
        states = self.stack(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask[..., None].to(states.dtype)
        mean = (states * weights).sum(1) / weights.sum(1).clamp(min=1)
        return torch.tanh(self.pool(mean))


def encoder_stack(shape: T5Config) -> nn.Module:
    """A T5 encoder stack of ``shape`` (its weights drawn anew; a checkpoint's are loaded over them), its
    feed-forward activation the fused kernel the base policy uses."""
    stack = T5EncoderModel(shape).encoder
    use_fused_gelu(stack.block)
    return stack


def vocabulary_digest(tokenizer: PreTrainedTokenizerBase) -> str:
    """SHA-256 of a tokenizer's vocabulary (each token and its id): towers read token ids, so a critic's towers
    only mean anything under the vocabulary they were trained with."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


class TextTowers(nn.Module):
    """The critic's towers (:data:`TOWERS`), each a copy of ``stack`` (the base policy's T5 encoder).

    Three towers, as released (its three RoBERTa encoders): a goal and a typed
    query are different kinds of text, and one shared encoder would pad every
    action type to the length of the goals it is batched with.
    """

    def __init__(self, stack: nn.Module, d_model: int) -> None:
        super().__init__()
        self.towers = nn.ModuleDict({name: TextTower(copy.deepcopy(stack), d_model) for name in TOWERS})
        self.train()

    def train(self, mode: bool = True) -> TextTowers:
        """Dense layers as ``mode`` says; the encoder stacks always without dropout, as released (its encoders are
        loaded in eval mode and never switched)."""
        super().train(mode)
        for tower in self.towers.values():
            tower.stack.eval()
        return self

    def encode(self, table: TextTable, requests: Mapping[str, tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Each request's (tower, rows) pooled states, by key: each tower called once, on the distinct rows of all
        the requests it serves (a step's goals of s and s', say)."""
        by_tower: dict[str, list[str]] = {}
        for key, (tower, _) in requests.items():
            by_tower.setdefault(tower, []).append(key)
        out: dict[str, torch.Tensor] = {}
        for tower, keys in by_tower.items():
            rows = [requests[key][1] for key in keys]
            pooled = self(tower, table, torch.cat([r.reshape(-1) for r in rows]))
            for key, part, r in zip(keys, pooled.split([r.numel() for r in rows]), rows, strict=True):
                out[key] = part.reshape(*r.shape, -1)
        return out

    def forward(self, tower: str, table: TextTable, rows: torch.Tensor) -> torch.Tensor:
        """(*rows.shape, d_model): ``tower``'s pooled states of the table's ``rows``, each distinct row encoded
        once."""
        distinct, back = torch.unique(rows.cpu(), return_inverse=True)
        mask = table.mask[distinct]
        width = max(1, int(mask.sum(1).max())) if len(distinct) else 1  # the table pads to its longest text
        ids, mask = table.ids[distinct, :width].to(self.device), mask[:, :width].to(self.device)
        return self.towers[tower](ids, mask)[back.to(self.device)]

    @torch.no_grad()
    def encode_all(self, table: TextTable, chunk: int = 512) -> dict[str, torch.Tensor]:
        """Every text of ``table`` through every tower, ``chunk`` texts a call in order of length (so each is padded
        little): (T, d_model) per tower, what scoring reads instead of calling the towers state by state."""
        order = torch.argsort(table.mask.sum(1), stable=True)
        back = torch.argsort(order)
        return {name: torch.cat([self(name, table, rows) for rows in order.split(chunk)])[back.to(self.device)]
                for name in self.towers}  # fmt: skip

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device
