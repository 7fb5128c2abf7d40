"""The policy: AutoUI's architecture (T5 + image features fused by gated attention).

AutoUI encodes the prompt ("Previous Actions: ... Goal: ...") with a T5
encoder, attends from every text state to projected image features with one
attention head, mixes the result in through a sigmoid gate, and decodes an
AutoUI action string with the T5 decoder. Here the same classes run at any
size: tiny by default (CPU, offline, with a small convolutional screenshot
encoder and an offline-built tokenizer), AutoUI-Base size for the real
checkpoint. Checkpoints describe themselves (config + weights + tokenizer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from digiq.models.blip2 import Blip2ImageFeatures
from digiq.models.checkpoint import (
    load_weights,
    read_released_weights,
    read_tokenizer,
    read_typed_config,
    save_checkpoint,
)
from digiq.noise import row_streams, token_uniforms

__all__ = [
    "PolicyConfig",
    "ScreenEncoder",
    "PooledFeatureScreen",
    "GatedImageFusion",
    "CopyHead",
    "StepDecoder",
    "AutoUIPolicy",
    "inverse_cdf_draw",
]


@dataclass(frozen=True)
class PolicyConfig:
    d_model: int = 128  # T5 width (AutoUI-Base: 768)
    d_ff: int = 256
    d_kv: int = 32
    num_heads: int = 4
    num_layers: int = 2  # encoder layers; the decoder has as many
    image_height: int = 114  # screenshots are resized to this before encoding
    image_width: int = 54
    image_grid: tuple[int, int] = (8, 4)  # screen regions the encoder summarises (rows, cols)
    image_dim: int = 128  # width of each region feature (AutoUI-Base: one 1408-d BLIP-2 feature)
    max_input_tokens: int = 96
    max_action_tokens: int = 48
    dropout: float = 0.1
    copy: bool = True  # pointer-generator head (off for a real AutoUI checkpoint)
    vocab_size: int = 0  # 0: the tokenizer's size (T5 checkpoints pad theirs: 32128 rows for 32100 tokens)
    tie_word_embeddings: bool = True  # output layer = embeddings, outputs scaled (T5 1.0); flan-T5 / AutoUI: neither
    image_encoder: str = "cnn"  # "cnn": ScreenEncoder, trained with the policy; "blip2": frozen BLIP-2 pooled feature
    image_encoder_path: str = ""  # blip2: the local BLIP-2 folder that screenshots go through
    screen_text: bool = False  # prompts end with the screen's elements as text (digiq.env.hierarchy); not AutoUI's

    def __post_init__(self) -> None:
        if self.image_encoder not in ("cnn", "blip2"):
            raise ValueError(f"image_encoder must be 'cnn' or 'blip2', got {self.image_encoder!r}")


def use_fused_gelu(blocks: Sequence[nn.Module]) -> None:
    """Give T5 blocks of "gated-gelu" torch's fused GELU: the same formula (GELU's tanh approximation), which
    transformers writes out op by op (tanh, pow, muls), at about half the cost per call."""
    for block in blocks:
        block.layer[-1].DenseReluDense.act = nn.GELU(approximate="tanh")


def inverse_cdf_draw(probs: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """One token per row of (B, V) probabilities at ``temperature`` (each raised to ``1 / temperature``, which is
    the softmax of the log-probabilities over the temperature): the first token whose cumulative mass exceeds
    ``u`` (B,) of the row's total. A token of probability 0 is never drawn."""
    weights = probs.double() if temperature == 1.0 else probs.double() ** (1.0 / temperature)
    cdf = weights.cumsum(-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return drawn.clamp_(max=probs.shape[-1] - 1)


class ScreenEncoder(nn.Module):
    """A small CNN: screenshot -> one feature per screen region (+ learned position)."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        c = cfg.image_dim
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 5, stride=2, padding=2), nn.GELU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(64, c, 3, stride=2, padding=1), nn.GELU(),
            nn.AdaptiveAvgPool2d(cfg.image_grid),
        )  # fmt: skip
        self.pos = nn.Parameter(torch.zeros(cfg.image_grid[0] * cfg.image_grid[1], c))
        self.size = (cfg.image_height, cfg.image_width)

    def prepare(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 screenshots of any size -> uint8 at the encoder's input size.

        Training preloads frames through this and rollouts pass live frames
        through it, so both see identically resampled pixels.
        """
        x = torch.as_tensor(np.asarray(images))
        (B, H, W, C), (h, w) = x.shape, self.size
        if (H, W) == (h, w):
            return x
        if H % h == 0 and W % w == 0:
            # Whole blocks: "area" resampling is the mean of each block. The block's rows, then its
            # columns, are added as whole slices in int16 (no float copy of the whole screenshot), then
            # divided once: the sums are exact either way, so the pixels are interpolate's float mean's.
            kh, kw = H // h, W // w
            wide = torch.int16 if 255 * kh * kw <= torch.iinfo(torch.int16).max else torch.int32  # a phone's 20 x 20
            rows = x.reshape(B, h, kh, W * C)
            summed = rows[:, :, 0].to(wide)
            for k in range(1, kh):
                summed += rows[:, :, k]
            cols = summed.reshape(B, h, w, kw, C)
            blocks = cols[:, :, :, 0].clone()
            for k in range(1, kw):
                blocks += cols[:, :, :, k]
            x = blocks.float() / (kh * kw)
        else:
            x = F.interpolate(x.permute(0, 3, 1, 2).float(), size=self.size, mode="area").permute(0, 2, 3, 1)
        return x.round().clamp(0, 255).to(torch.uint8).contiguous()

    def forward(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 -> (B, regions, image_dim)."""
        x = self.prepare(images).to(self.pos.device).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        return self.net(x.to(self.pos.dtype)).flatten(2).transpose(1, 2) + self.pos


class PooledFeatureScreen(nn.Module):
    """AutoUI's image input: one pooled BLIP-2 feature per screenshot; nothing here is trained.

    ``prepare`` runs screenshots through the frozen tower once (training
    preloads through it, as with the CNN) or passes precomputed features
    through: the released data's ``image_features``. The tower
    is loaded on first use from ``image_encoder_path`` and is never part of a
    policy checkpoint: it is frozen and a gigabyte large.
    """

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.dim, self.path = cfg.image_dim, cfg.image_encoder_path
        self.register_buffer("anchor", torch.empty(0), persistent=False)  # follows the policy's device
        self.tower: Blip2ImageFeatures | None = None

    def prepare(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 screenshots, or (B, dim) / (B, 1, dim) float features -> (B, 1, dim) float32."""
        x = torch.as_tensor(np.asarray(images)) if not isinstance(images, torch.Tensor) else images
        if not x.is_floating_point():
            if self.tower is None:
                if not self.path:
                    raise ValueError("this policy reads BLIP-2 features: set image_encoder_path to a local BLIP-2 "
                                     "folder, or pass precomputed (B, dim) features")  # fmt: skip
                self.tower = Blip2ImageFeatures.from_pretrained(self.path)
            self.tower.vision.to(self.anchor.device)  # where the policy is now (a no-op when already there)
            x = self.tower(x)
        x = x.float().reshape(len(x), -1)
        if x.shape[-1] != self.dim:
            raise ValueError(f"image features have width {x.shape[-1]}, the policy expects {self.dim}")
        return x[:, None]

    def forward(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        return self.prepare(images).to(self.anchor.device)


class GatedImageFusion(nn.Module):
    """AutoUI's fusion: single-head attention from text states to image features, mixed in by a gate.

    The modules carry Auto-UI-Base's own names (``image_dense``, ``mha_layer``,
    ``gate_dense``) so the released weights load by name (:meth:`AutoUIPolicy.from_autoui`).
    """

    def __init__(self, d_model: int, image_dim: int) -> None:
        super().__init__()
        self.image_dense = nn.Linear(image_dim, d_model)
        self.mha_layer = nn.MultiheadAttention(d_model, num_heads=1, batch_first=True)
        self.gate_dense = nn.Linear(2 * d_model, d_model)

    def forward(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        img = self.image_dense(image.to(text.dtype))  # features arrive float32 (preloaded, released); bf16 on a GPU
        image_att, _ = self.mha_layer(text, img, img, need_weights=False)
        gate = torch.sigmoid(self.gate_dense(torch.cat([text, image_att], -1)))
        return (1 - gate) * text + gate * image_att


class CopyHead(nn.Module):
    """Pointer-generator mixing: the next token is generated, or copied from the prompt.

    Typing "What's the news in Peru" means reproducing words of the goal, often
    words never seen as outputs in training (test entities are unseen). A tiny
    T5 memorises training queries instead; a copy distribution over the prompt's
    tokens, mixed in by a learned gate (See et al., 2017), lets it reproduce
    any span. Off for a real AutoUI checkpoint, which has no such head.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = nn.Linear(d_model, d_model)
        self.gate = nn.Linear(2 * d_model, 1)
        # Bonuses for the prompt positions that continue what was just written:
        # one when the token before the position is the token just written, one
        # more when the two tokens before it are the last two written. Copying
        # then continues a span ("Uru" -> "guay") instead of jumping about; the
        # second bonus matters because spaces are tokens of their own, so "the
        # token after a space" alone is ambiguous.
        self.continue_span = nn.Parameter(torch.tensor([1.0, 2.0]))
        # Where a span starts: the token just written (e.g. the piece ending in
        # '"typed_text": "') against the token before each prompt position (e.g.
        # the quote opening the query in the goal). Content attention alone
        # finds the start poorly for words unseen in training: it attends far
        # less to the first token of an unseen query than to the ones after it.
        self.start_query = nn.Linear(d_model, d_model, bias=False)
        self.start_key = nn.Linear(d_model, d_model, bias=False)

    def start_keys(self, input_ids: torch.Tensor, embed: nn.Embedding) -> torch.Tensor:
        """The start term's keys (B, L, d): one per prompt position, from the token before it.

        They depend on the prompt only, so a decoding loop computes them once
        per prompt rather than once per written token. The first position's
        missing predecessor reads as token 0, the padding.
        """
        before1 = torch.cat([torch.zeros_like(input_ids[:, :1]), input_ids[:, :-1]], 1)
        return self.start_key(embed(before1))

    def forward(self, logits: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor, mask: torch.Tensor,
                input_ids: torch.Tensor, keys: torch.Tensor, written: torch.Tensor,
                embed: nn.Embedding) -> torch.Tensor:  # fmt: skip
        """Probabilities (B, T, V) of the mixture: what sampling draws from.

        ``keys`` are :meth:`start_keys` of ``input_ids``. ``written`` (B, T + 1)
        are the decoder's tokens so far: column t + 1 is the token just written
        before output t, column t the one before it. ``embed`` is the policy's
        token embedding, which both sides of the start term read.
        """
        attn, p_gen = self._attend(hidden, states, mask, input_ids, keys, written, embed)
        copy = torch.zeros_like(logits).scatter_add_(2, input_ids[:, None, :].expand(-1, logits.shape[1], -1), attn)
        return p_gen * torch.softmax(logits.float(), -1) + (1 - p_gen) * copy

    def target_probs(self, logits: torch.Tensor, targets: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor,
                     mask: torch.Tensor, input_ids: torch.Tensor, keys: torch.Tensor, written: torch.Tensor,
                     embed: nn.Embedding) -> torch.Tensor:  # fmt: skip
        """The mixture's probability (B, T) of ``targets`` (B, T) alone; the other arguments as :meth:`forward`'s.

        What a loss reads: the generated share is the target's logit against
        the log-sum-exp of all, the copied share the attention on the prompt
        positions that hold the target. Neither the softmax nor the copy
        distribution over the whole vocabulary is built, nor its gradient.
        """
        attn, p_gen = self._attend(hidden, states, mask, input_ids, keys, written, embed)
        logits, p_gen = logits.float(), p_gen[..., 0]
        generated = (logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, -1)).exp()
        copied = (attn * (input_ids[:, None, :] == targets[..., None])).sum(-1)
        return p_gen * generated + (1 - p_gen) * copied

    def _attend(self, hidden: torch.Tensor, states: torch.Tensor, mask: torch.Tensor, input_ids: torch.Tensor,
                keys: torch.Tensor, written: torch.Tensor, embed: nn.Embedding) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The copy attention over the prompt's positions (B, T, L) and the probability of generating (B, T, 1)."""
        d = hidden.shape[-1]
        none = torch.full_like(input_ids[:, :1], -1)
        before1 = torch.cat([none, input_ids[:, :-1]], 1)  # the prompt token before each position
        before2 = torch.cat([none, none, input_ids[:, :-2]], 1)[:, : input_ids.shape[1]]
        start = self.start_query(embed(written[:, 1:])) @ keys.transpose(1, 2)
        scores = self.query(hidden) @ states.transpose(1, 2) / math.sqrt(d) + start / math.sqrt(d)
        last1 = before1[:, None, :] == written[:, 1:, None]
        last2 = last1 & (before2[:, None, :] == written[:, :-1, None])
        scores = scores + self.continue_span[0] * last1 + self.continue_span[1] * last2
        attn = torch.softmax(scores.masked_fill(mask[:, None, :] == 0, float("-inf")), -1)  # (B, T, L)
        context = attn @ states
        return attn, torch.sigmoid(self.gate(torch.cat([hidden, context], -1)))


def _rms_norm(norm: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """T5's layer norm (``T5LayerNorm``: scale by the root mean square, no mean, no bias) as torch's one call,
    which gives the same floats for float32 states with a few ops fewer per token."""
    return F.rms_norm(h, (h.shape[-1],), norm.weight, norm.variance_epsilon)


class StepDecoder:
    """T5's decoder run one token at a time on a policy's weights: what sampling calls per token.

    The arithmetic of ``T5ForConditionalGeneration``'s decoder with a key/value
    cache: RMS norms, unscaled attention with T5's relative position bias in
    self-attention, masked cross-attention over the fused encoder states, the
    gated-GELU feed-forward, the final norm and the output layer. It leaves out
    what costs more than that arithmetic at this model size: building masks,
    cache objects and output hooks on every call. Keys and values go into
    buffers allocated once; cross-attention's are computed once per prompt;
    products that read the same input are taken as one. Inference only (no
    dropout). Tests check it against transformers' decoder.
    """

    def __init__(self, t5: T5ForConditionalGeneration, states: torch.Tensor, mask: torch.Tensor, max_len: int,
                 rows: torch.Tensor | None = None) -> None:  # fmt: skip
        """Decode from the encoder's ``states`` (P, L, d) and their ``mask`` (P, L): one decoded row for each of
        ``rows`` (B,), the prompt it reads (repeats allowed: the samples of one prompt), all P in order by default.

        Cross-attention's keys and values are computed once per prompt and
        then copied to its rows: a prompt sampled 15 times projects its
        states once, not 15 times (the same floats, row by row).
        """
        cfg = t5.config
        self.t5, self.blocks = t5, list(t5.decoder.block)
        rows = torch.arange(len(states), device=states.device) if rows is None else rows
        self.batch, self.heads, self.d_kv = len(rows), cfg.num_heads, cfg.d_kv
        # Per block, cross-attention's keys transposed and its values, contiguous: a query multiplies them as they
        # lie at every step (plain products, which beat the fused attention kernel at one query per row).
        self.cross = [(self._split(b.layer[1].EncDecAttention.k(states)).transpose(2, 3).contiguous()[rows],
                       self._split(b.layer[1].EncDecAttention.v(states)).contiguous()[rows]) for b in self.blocks]  # fmt: skip
        lowest = torch.finfo(states.dtype).min  # padding of the prompt: never attended to
        self.cross_mask = torch.zeros_like(mask[rows], dtype=states.dtype).masked_fill(mask[rows] == 0, lowest)
        self.cross_mask = self.cross_mask[:, None, None, :]
        shape = (len(self.blocks), self.batch, self.heads, max_len, self.d_kv)
        self.keys, self.values = states.new_zeros(shape), states.new_zeros(shape)
        # (1, heads, max_len, max_len): row t holds the bias of query position t over keys 0..max_len-1.
        self.bias = self.blocks[0].layer[0].SelfAttention.compute_bias(max_len, max_len, device=states.device)
        self.scale = cfg.d_model**-0.5 if cfg.scale_decoder_outputs else None
        # Each block's self-attention query, key and value as one matrix, and the feed-forward's two input
        # matrices as one: one product instead of three (two) per token, with the same sums in each column.
        self.qkv = [torch.cat([b.layer[0].SelfAttention.q.weight, b.layer[0].SelfAttention.k.weight,
                               b.layer[0].SelfAttention.v.weight]) for b in self.blocks]  # fmt: skip
        self.ff_in = [torch.cat([b.layer[2].DenseReluDense.wi_0.weight, b.layer[2].DenseReluDense.wi_1.weight])
                      for b in self.blocks]  # fmt: skip
        self.t = 0

    def keep(self, rows: torch.Tensor) -> None:
        """Go on with ``rows`` (indices into the current batch) only: finished rows cost nothing more."""
        self.batch = len(rows)
        self.cross = [(k[rows], v[rows]) for k, v in self.cross]
        self.cross_mask = self.cross_mask[rows]
        self.keys, self.values = self.keys[:, rows], self.values[:, rows]

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, heads * d_kv) -> (B, heads, T, d_kv)."""
        return x.view(len(x), -1, self.heads, self.d_kv).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(self.batch, -1, self.heads * self.d_kv)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one token per row (B,); the decoder's last hidden state (B, 1, d) and the logits (B, 1, V)."""
        t = self.t
        if t >= self.keys.shape[3]:
            raise RuntimeError(f"StepDecoder holds {self.keys.shape[3]} positions; all are used")
        h = self.t5.decoder.embed_tokens(tokens[:, None])
        bias = self.bias[:, :, t : t + 1, : t + 1]
        for i, block in enumerate(self.blocks):
            own, cross, ff = block.layer
            attn = own.SelfAttention
            qkv = F.linear(_rms_norm(own.layer_norm, h), self.qkv[i])
            q, k, v = qkv.view(self.batch, 3, self.heads, 1, self.d_kv).unbind(1)
            self.keys[i, :, :, t : t + 1], self.values[i, :, :, t : t + 1] = k, v
            out = F.scaled_dot_product_attention(q, self.keys[i, :, :, : t + 1], self.values[i, :, :, : t + 1],
                                                 attn_mask=bias, scale=1.0)  # fmt: skip
            h = h + attn.o(self._merge(out))
            attn, x = cross.EncDecAttention, _rms_norm(cross.layer_norm, h)
            keys_t, values = self.cross[i]
            out = torch.softmax(self._split(attn.q(x)) @ keys_t + self.cross_mask, -1) @ values
            h = h + attn.o(self._merge(out))
            dense = ff.DenseReluDense
            gate, up = F.linear(_rms_norm(ff.layer_norm, h), self.ff_in[i]).chunk(2, -1)
            h = h + dense.wo(dense.act(gate) * up)
        h = _rms_norm(self.t5.decoder.final_layer_norm, h)
        self.t += 1
        return h, self.t5.lm_head(h if self.scale is None else h * self.scale)


# What AutoUI's T5 (flan-alpaca-base) uses; other values would need options this class does not have.
_AUTOUI_T5 = {"feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32,
              "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6}  # fmt: skip
# Copies of ``shared`` that T5 checkpoints also store, and a tensor AutoUI's own loader ignores.
_AUTOUI_REDUNDANT = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                     "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}  # fmt: skip


class AutoUIPolicy(nn.Module):
    """T5 encoder-decoder + screen features; reads prompts and screenshots, writes AutoUI action strings."""

    def __init__(self, cfg: PolicyConfig, tokenizer: PreTrainedTokenizerFast) -> None:
        super().__init__()
        self.cfg, self.tokenizer = cfg, tokenizer
        t5 = T5Config(
            vocab_size=cfg.vocab_size or len(tokenizer), d_model=cfg.d_model, d_ff=cfg.d_ff, d_kv=cfg.d_kv, num_heads=cfg.num_heads,
            num_layers=cfg.num_layers, num_decoder_layers=cfg.num_layers, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
            feed_forward_proj="gated-gelu", tie_word_embeddings=cfg.tie_word_embeddings, dropout_rate=cfg.dropout,
        )  # fmt: skip
        self.t5 = T5ForConditionalGeneration(t5)
        use_fused_gelu([*self.t5.encoder.block, *self.t5.decoder.block])
        if not cfg.tie_word_embeddings:  # transformers ties T5's output layer to the embeddings regardless
            self.t5.lm_head.weight = nn.Parameter(self.t5.lm_head.weight.detach().clone())
        self.screen = ScreenEncoder(cfg) if cfg.image_encoder == "cnn" else PooledFeatureScreen(cfg)
        self.fusion = GatedImageFusion(cfg.d_model, cfg.image_dim)
        self.copy = CopyHead(cfg.d_model) if cfg.copy else None

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------ encoding

    def _prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        # On the right whatever the tokenizer was last set to (a VLM sharing it pads on the left): the copy head
        # reads the token before each position, and padding before the prompt would read as one.
        enc = self.tokenizer(prompts, padding=True, padding_side="right", truncation=True,
                             max_length=self.cfg.max_input_tokens, return_tensors="pt")  # fmt: skip
        return {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}

    def encode(self, prompts: list[str], screenshots: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:
        """Fused encoder states (B, L, d), their attention mask, the prompt's token ids (and the copy head's start keys)."""
        return self._encode_tokens(self._prompts(prompts), screenshots)

    def _encode_tokens(self, enc: dict[str, torch.Tensor],
                       screenshots: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
        """:meth:`encode` of prompts already tokenized (``input_ids`` and ``attention_mask``, padded on the right)."""
        text = self.t5.encoder(**enc).last_hidden_state
        out = {"states": self.fusion(text, self.screen(screenshots)), "mask": enc["attention_mask"],
               "input_ids": enc["input_ids"]}  # fmt: skip
        if self.copy is not None:
            out["start_keys"] = self.copy.start_keys(enc["input_ids"], self.t5.shared)
        return out

    def encode_by_length(self, prompts: list[str], screenshots: np.ndarray | torch.Tensor,
                         group: int = 8) -> dict[str, torch.Tensor]:  # fmt: skip
        """:meth:`encode`, the prompts taken ``group`` at a time in order of length, so that each is padded only to
        the longest of its group; the outputs are padded back to the longest of all (masked) in the given order.

        Real prompts differ in length by the actions before them: padded to a
        batch's longest, a 48-row batch encodes about 1.7 times the tokens it
        holds. Every row's states are its own (padding is masked), so this
        changes what the encoder spends, not what it computes beyond the
        last bits of float sums. Groups of 8 rows pad less than groups of 16
        and still fill the encoder's matrix products.
        """
        parts = [(rows, self._encode_tokens(enc, screenshots[rows])) for rows, enc in self._by_length(prompts, group)]
        longest = max(part["mask"].shape[1] for _, part in parts)
        fill = {"mask": 0, "input_ids": self.tokenizer.pad_token_id}  # states and start keys: zeros
        out: dict[str, torch.Tensor] = {}
        for key, first in parts[0][1].items():
            out[key] = first.new_full((len(prompts), longest, *first.shape[2:]), fill.get(key, 0))
            for rows, part in parts:
                out[key][torch.as_tensor(rows), : part[key].shape[1]] = part[key]
        return out

    def _by_length(self, prompts: list[str], group: int) -> list[tuple[np.ndarray, dict[str, torch.Tensor]]]:
        """The prompts tokenized once, taken ``group`` at a time in order of length: each group's rows (indices into
        ``prompts``) and its ``input_ids`` and ``attention_mask``, padded on the right to the group's longest."""
        if group < 1:
            raise ValueError(f"prompts are taken in groups of at least 1, got {group}")
        ids = self.tokenizer(prompts, truncation=True, max_length=self.cfg.max_input_tokens).input_ids
        order = np.argsort([len(row) for row in ids], kind="stable")
        groups = []
        for rows in np.array_split(order, -(-len(prompts) // group)):
            enc = self.tokenizer.pad({"input_ids": [ids[i] for i in rows]}, padding_side="right", return_tensors="pt")
            groups.append((rows, {k: enc[k].to(self.device) for k in ("input_ids", "attention_mask")}))
        return groups

    @torch.no_grad()
    def text_features(self, texts: list[str]) -> torch.Tensor:
        """The T5 encoder's states averaged over each text's tokens, without the screen: (B, d_model).

        The critic reads goals and actions through it, as Digi-Q's critic reads
        them through a language model of its own (RoBERTa in the release).
        """
        enc = self._prompts(texts)
        states = self.t5.encoder(**enc).last_hidden_state
        mask = enc["attention_mask"][..., None].to(states.dtype)
        return (states * mask).sum(1) / mask.sum(1).clamp(min=1)

    def _labels(self, actions: list[str]) -> torch.Tensor:
        lab = self.tokenizer(actions, padding=True, truncation=True, max_length=self.cfg.max_action_tokens,
                             return_tensors="pt").input_ids.to(self.device)  # fmt: skip
        return lab.masked_fill(lab == self.tokenizer.pad_token_id, -100)

    def _target_logprobs(self, enc: dict[str, torch.Tensor], written: torch.Tensor,
                         targets: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Log-probabilities (B, T) of ``targets`` (B, T), each the next token after the decoder's input so far,
        the whole input at once (training and scoring).

        ``written`` (B, T + 1): the decoder's input tokens preceded by the token
        before them, which the copy head uses to continue spans (pad when there is none).
        Only the target's probability is computed (:meth:`CopyHead.target_probs`), not a distribution over
        the vocabulary at every position.
        """
        out = self.t5(encoder_outputs=BaseModelOutput(last_hidden_state=enc["states"]), attention_mask=enc["mask"],
                      decoder_input_ids=written[:, 1:], output_hidden_states=self.copy is not None)  # fmt: skip
        if self.copy is None:
            logits = out.logits.float()
            return logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, -1)
        probs = self.copy.target_probs(out.logits, targets, out.decoder_hidden_states[-1], enc["states"], enc["mask"],
                                       enc["input_ids"], enc["start_keys"], written, self.t5.shared)  # fmt: skip
        return torch.log(probs.clamp_min(1e-12))

    def _next_token_probs(self, enc: dict[str, torch.Tensor], logits: torch.Tensor, hidden: torch.Tensor,
                          written: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Next-token probabilities: the softmax of ``logits``, or the copy head's mixture of it with copying from
        the prompt. Sampling draws from these directly; a log would cost as much as the mixing."""
        if self.copy is None:
            return torch.softmax(logits.float(), -1)
        return self.copy(logits, hidden, enc["states"], enc["mask"], enc["input_ids"], enc["start_keys"], written,
                         self.t5.shared)  # fmt: skip

    def _summed_logprobs(self, prompts: list[str], screenshots: np.ndarray | torch.Tensor, actions: list[str],
                         group: int, clamp: tuple[float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Per row, its action's token log-probabilities summed (B,) and its number of tokens (B,); with ``clamp``
        (low, high), each token's probability clamped to it first (no gradient beyond it).

        The rows go through the model ``group`` at a time in order of prompt
        length (:meth:`_by_length`), each group padded to its own longest
        prompt and action, not every row to the batch's longest (prompts
        differ in length by the actions before them). Every row's numbers
        are its own (padding is masked), so the grouping changes what the
        model spends, not what it computes beyond the last bits of float
        sums (and, in training, which dropout masks are drawn).
        """
        if not len(prompts) == len(screenshots) == len(actions):
            raise ValueError(f"{len(prompts)} prompts, {len(screenshots)} screenshots and {len(actions)} actions: "
                             "one of each per row")  # fmt: skip
        pad = self.tokenizer.pad_token_id
        sums, counts, order = [], [], []
        for rows, tokens in self._by_length(prompts, group):
            enc = self._encode_tokens(tokens, screenshots[rows])
            labels = self._labels([actions[i] for i in rows])
            dec_in = self.t5._shift_right(labels.masked_fill(labels == -100, pad))
            logp = self._target_logprobs(enc, F.pad(dec_in, (1, 0), value=pad), labels.clamp(min=0))
            if clamp is not None:
                logp = logp.clamp(math.log(clamp[0]), math.log(clamp[1]))
            keep = labels != -100
            sums.append((logp * keep).sum(-1))
            counts.append(keep.sum(-1))
            order.append(rows)
        back = torch.as_tensor(np.argsort(np.concatenate(order)), device=self.device)  # to the given order
        return torch.cat(sums)[back], torch.cat(counts)[back]

    # ------------------------------------------------------------ scoring and sampling

    def action_logprobs(self, prompts: list[str], screenshots: np.ndarray | torch.Tensor, actions: list[str],
                        group: int = 32) -> torch.Tensor:  # fmt: skip
        """log pi(action | prompt, screenshot), summed over tokens, one per row (``group``: :meth:`_summed_logprobs`)."""
        return self._summed_logprobs(prompts, screenshots, actions, group)[0]

    def loss(self, prompts: list[str], screenshots: np.ndarray | torch.Tensor, actions: list[str],
             weights: torch.Tensor | None = None, group: int = 32, per_token: bool = True,
             clamp: tuple[float, float] | None = None) -> torch.Tensor:  # fmt: skip
        """Negative log-likelihood of ``actions`` (optionally weighted per row): per row the mean over its tokens,
        or with ``per_token`` false their sum (as released Digi-Q's actor), each token's probability clamped to
        ``clamp`` (low, high) where given.

        Weighted, it is sum(w * NLL) / sum(|w|): with REINFORCE's weights (the
        advantage, of either sign) sum(w) can be near 0 or negative, which
        would blow the step up or turn it around; sum(|w|) is sum(w) for
        positive weights. The rows go through the model ``group`` at a time
        (:meth:`_summed_logprobs`); the loss is the whole batch's.
        """
        logp, tokens = self._summed_logprobs(prompts, screenshots, actions, group, clamp)
        per_row = -logp / tokens.clamp(min=1) if per_token else -logp
        if weights is None:
            return per_row.mean()
        return (per_row * weights).sum() / weights.abs().sum().clamp(min=1e-8)

    @torch.no_grad()
    def sample(self, prompts: list[str], screenshots: np.ndarray, n: int = 1, temperature: float = 1.0,
               greedy: bool = False, noise: Sequence[int] | None = None) -> list[list[str]]:  # fmt: skip
        """``n`` action strings per row, sampled at ``temperature`` (or the greedy one).

        ``noise`` holds one key per row (:func:`digiq.noise.noise_key`, e.g. of the episode's
        seed and step): sample ``j`` of row ``i`` draws its tokens from the
        stream of (``noise[i]``, ``j``) alone (:mod:`digiq.noise`), so it is
        the same whatever else is in the batch, in what order, on how many
        workers. Each token is drawn by inverting the cumulative distribution
        of the temperature-scaled probabilities at that stream's next uniform.

        Our own decoding loop: :class:`StepDecoder` runs T5's decoder a token at
        a time, the copy head mixes in copying, and a row that has written its
        end token leaves the batch. Sampling runs the model as at inference (no
        dropout), whatever its mode.
        """
        return self.sample_encoded(self.encode_by_length(prompts, screenshots), n, temperature, greedy, noise)

    @torch.no_grad()
    def sample_encoded(self, enc: dict[str, torch.Tensor], n: int = 1, temperature: float = 1.0, greedy: bool = False,
                       noise: Sequence[int] | None = None, rows: Sequence[int] | None = None) -> list[list[str]]:  # fmt: skip
        """:meth:`sample` of prompts already encoded (:meth:`encode_by_length`): ``n`` actions for each of ``rows``,
        indices into ``enc``'s prompts (repeats allowed), all of them in order by default; ``noise`` holds one key
        per entry of ``rows``.

        What a prompt sampled again needs is then encoded once: stage 02
        redraws its invalid candidates from the states it encoded for the
        first draws. Each prompt's cross-attention keys and values are
        computed once, however many of the decoded rows read them
        (:class:`StepDecoder`), and the prompts are cut to the longest of
        those sampled. A row's tokens are those :meth:`sample` draws for
        it, up to the last bits of float sums over another batch.
        """
        picked = torch.arange(len(enc["states"])) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not greedy and (noise is None or len(noise) != len(picked)):
            raise ValueError(f"sampling takes one noise key per prompt: {len(picked)} prompts, "
                             f"{'no keys' if noise is None else f'{len(noise)} keys'}")  # fmt: skip
        if n == 0 or len(picked) == 0:  # nothing to draw (stage 02 with one candidate a state: the action taken)
            return [[] for _ in range(len(picked))]
        distinct, of_prompt = torch.unique(picked.to(self.device), return_inverse=True)
        longest = int(enc["mask"][distinct].sum(1).max())  # padded on the right: what lies past it is padding
        enc = {k: v[distinct, :longest] for k, v in enc.items()}
        expand = of_prompt.repeat_interleave(n)  # decoded row -> its prompt
        decoder = StepDecoder(self.t5, enc["states"], enc["mask"], self.cfg.max_action_tokens, rows=expand)
        enc = {k: v[expand] for k, v in enc.items()}  # the copy head reads each decoded row's prompt
        B = len(expand)
        streams = np.zeros(B, np.uint64) if noise is None else row_streams(noise, n)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        written = torch.full((B, self.cfg.max_action_tokens), pad, dtype=torch.long, device=self.device)
        decoding = torch.arange(B, device=self.device)  # the rows being decoded, as indices into the batch
        going = torch.ones(B, dtype=torch.bool, device=self.device)  # per decoded row: no end token written yet
        tokens = torch.full((B, 2), pad, dtype=torch.long, device=self.device)  # (pad before the start, start)
        for t in range(self.cfg.max_action_tokens):
            hidden, logits = decoder.step(tokens[:, -1])
            probs = self._next_token_probs(enc, logits, hidden, tokens[:, -2:])[:, -1]
            if greedy:
                nxt = probs.argmax(-1)
            else:
                u = torch.from_numpy(token_uniforms(streams[decoding.cpu().numpy()], t)).to(self.device)
                nxt = inverse_cdf_draw(probs, temperature, u)
            nxt = nxt.masked_fill(~going, pad)  # a finished row not yet dropped writes nothing more
            written[decoding, t] = nxt
            going &= nxt != eos
            still = int(going.sum())
            if still == 0:
                break
            # Finished rows leave the decoder once they are a quarter of it: each drop copies its caches.
            if len(decoding) - still >= max(1, len(decoding) // 4):
                keep = going.nonzero()[:, 0]
                decoding, nxt, tokens, going = decoding[keep], nxt[keep], tokens[keep], going[keep]
                enc = {k: v[keep] for k, v in enc.items()}
                decoder.keep(keep)
            tokens = torch.cat([tokens[:, -1:], nxt[:, None]], 1)
        text = self.tokenizer.batch_decode(written, skip_special_tokens=True)
        return [text[i * n : (i + 1) * n] for i in range(len(picked))]

    # ------------------------------------------------------------ checkpoints

    def save(self, folder: Path | str, **meta: object) -> None:
        """Weights, config, tokenizer and ``meta`` (e.g. step, stage): enough to rebuild the model anywhere.

        ``folder`` is replaced whole (:func:`~digiq.models.checkpoint.save_checkpoint`): a save cut short
        leaves the previous checkpoint, never this tokenizer beside its weights.
        """
        save_checkpoint(folder, self, "policy", self.cfg, tokenizer=self.tokenizer, **meta)

    @classmethod
    def load(cls, folder: Path | str, device: str = "cpu", image_encoder_path: str | None = None) -> "AutoUIPolicy":
        """A checkpoint written by :meth:`save`; ``image_encoder_path`` overrides where its BLIP-2 folder is."""
        pc = read_typed_config(folder, "policy", PolicyConfig)
        if image_encoder_path is not None:
            pc = replace(pc, image_encoder_path=str(image_encoder_path))
        model = cls(pc, read_tokenizer(folder))
        load_weights(folder, model)
        return model.to(device).eval()

    @classmethod
    def from_autoui(
        cls, folder: Path | str, image_encoder_path: Path | str = "", device: str = "cpu"
    ) -> "AutoUIPolicy":
        """Auto-UI-Base as released: a T5 ``config.json``, weights named as in AutoUI's code, and its tokenizer.

        The weights are T5's (``shared``, ``encoder.*``, ``decoder.*``,
        ``lm_head``) plus the fusion's ``image_dense``, ``mha_layer`` and
        ``gate_dense``; the image input is BLIP-2's pooled feature, computed
        by the tower in ``image_encoder_path`` or given precomputed.
        """
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no AutoUI checkpoint in {folder} (config.json missing)")
        t5 = T5Config.from_pretrained(folder)
        for key, supported in _AUTOUI_T5.items():
            if getattr(t5, key) != supported:
                raise ValueError(f"{folder}: T5 {key}={getattr(t5, key)!r} is not supported (AutoUI: {supported!r})")
        if t5.num_decoder_layers != t5.num_layers:
            raise ValueError(f"{folder}: {t5.num_layers} encoder but {t5.num_decoder_layers} decoder layers")
        weights = read_released_weights(folder)
        if "image_dense.weight" not in weights:
            raise ValueError(f"{folder} has no image_dense weights: a plain T5, not an AutoUI checkpoint")
        cfg = PolicyConfig(d_model=t5.d_model, d_ff=t5.d_ff, d_kv=t5.d_kv, num_heads=t5.num_heads,
                           num_layers=t5.num_layers, image_dim=weights["image_dense.weight"].shape[1],
                           max_input_tokens=512, max_action_tokens=128, dropout=t5.dropout_rate, copy=False,
                           vocab_size=t5.vocab_size, tie_word_embeddings=t5.scale_decoder_outputs,
                           image_encoder="blip2", image_encoder_path=str(image_encoder_path))  # fmt: skip
        model = cls(cfg, AutoTokenizer.from_pretrained(folder))
        fusion = {f"fusion.{k}" for k in model.fusion.state_dict()}
        ours = {}
        for k, v in weights.items():
            if k in _AUTOUI_REDUNDANT:
                continue
            name = f"fusion.{k}" if f"fusion.{k}" in fusion else f"t5.{k}"
            ours[name] = v
        missing, unexpected = model.load_state_dict(ours, strict=False)
        tied = {"t5.encoder.embed_tokens.weight", "t5.decoder.embed_tokens.weight"}
        if t5.tie_word_embeddings:
            tied.add("t5.lm_head.weight")
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise ValueError(f"{folder} does not match the AutoUI layout: missing {missing[:8]}, "
                             f"unexpected {[k.removeprefix('t5.') for k in unexpected[:8]]}")  # fmt: skip
        return model.to(device).eval()
