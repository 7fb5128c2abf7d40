"""Tokenizers built offline.

The real AutoUI and LLaVA checkpoints bring their own tokenizers. The tiny
default models get a byte-level BPE tokenizer trained in memory on text of
the kind they will see (instructions, AutoUI action strings, prompts), so
nothing is downloaded and any string still encodes (bytes are the fallback).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from digiq.env.actions import ActionType, format_action, press_enter, swipe, tap, type_text
from digiq.env.taskgen import generate_tasks

__all__ = ["SPECIAL_TOKENS", "ACTION_PIECES", "train_tokenizer", "default_corpus", "llava_style_tokenizer"]

SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>", "<image>"]

# Everything between the action type and the typed text of an action without
# coordinates (type, enter, home, back, complete).
NO_POINTS = '", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": "'
# The fixed pieces of every AutoUI action string, one token each: an action
# then takes ~25 tokens instead of ~65, which makes sampling N candidates per
# state (stage 02) and every training step about 2.5x cheaper.
ACTION_PIECES = [
    "Action Plan: [", "] ; Action Decision: ", '"action_type": "', '", "touch_point": "[',
    ']", "lift_point": "[', ']", "typed_text": "', NO_POINTS, "Previous Actions: ", " Goal: ",
] + [t.value for t in ActionType if t is not ActionType.INVALID]  # fmt: skip
# Coordinates "0.5200" start with one of these (then two more digits): one token
# for where on the screen, instead of three digit pieces a tiny model garbles.
COORD_PIECES = [f"{i / 100:.2f}" for i in range(101)]
ANSWER_PIECES = [" Yes", " No"]  # the VLM's answers, one token each


def default_corpus(n_tasks: int = 2000, seed: int = 0, split_seed: int = 0) -> list[str]:
    """Text like the models' inputs and outputs: train-split instructions and AutoUI actions.

    ``split_seed`` must be the task lists' own, so that no validation or test entity enters the vocabulary.
    """
    rng = random.Random(seed)
    tasks = (generate_tasks("general", "train", n_tasks, seed, split_seed)
             + generate_tasks("webshop", "train", n_tasks // 2, seed, split_seed))  # fmt: skip
    lines = [f"Previous Actions: Goal: {t}" for t in tasks]
    for t in tasks:
        y, x = rng.random(), rng.random()
        plan = [ActionType.DUAL_POINT, ActionType.TYPE, ActionType.PRESS_ENTER, ActionType.STATUS_TASK_COMPLETE]
        lines.append(format_action(tap(y, x), plan))
        lines.append(format_action(swipe((y, x), (rng.random(), x))))
        lines.append(format_action(type_text(t.lower().rstrip("?"))))
        lines.append(format_action(press_enter()))
    return lines


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (T5-style: pad=0, eos appended) trained on ``corpus``."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Spaces are tokens of their own, so a word encodes the same wherever it
    # stands: "clock" typed at the start of a text field is the same token as
    # "clock" inside the goal, which the copy head can then point at.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(p, normalized=False) for p in ACTION_PIECES + COORD_PIECES + ANSWER_PIECES])
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=512
    )


def llava_style_tokenizer(corpus: Iterable[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE like llava-hf's (words start with "▁"; <s>, </s>, <pad>, <image>), built offline.

    It stands in for LLaVA-1.5's own tokenizer where no checkpoint can be
    downloaded: the tests' tiny llava-hf folder and the real-size benchmark.
    What matters is the convention the code relies on: an answer is one
    "▁Yes" / "▁No" token after "Answer:", and "<image>" is one token.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        show_progress=False))  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")  # fmt: skip
