"""What the critic reads beside the VLM's features: as in Digi-Q, text features of the goal and the actions.

Digi-Q's critic does not rely on the VLM representation alone. In its
release Q reads the goal, the previous action's type and typed text, and the
candidate's type and typed text, each through a language model (RoBERTa),
beside the state's image features and the VLM's (state, action)
representation; V reads the same without the candidate. Here the language
model is the base policy's T5 encoder (AutoUI's, with the released
checkpoint), frozen, its states averaged over the tokens
(:meth:`AutoUIPolicy.text_features`).

Without them the critic cannot tell a candidate that types the goal's words
from one that types garbage: the VLM's fine-tune asks only whether an action
changes the screen. These functions compute them from strings and a policy;
the critic_inputs stage (:mod:`digiq.stages.critic_inputs`) writes them for
every stored step and candidate, and :func:`digiq.data.features.critic_inputs`
puts them beside the VLM's features.
"""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

import numpy as np
import pandas as pd

from digiq.env.actions import ActionType, format_action, parse_action
from digiq.env.hierarchy import Tapped
from digiq.models.policy import AutoUIPolicy

__all__ = [
    "action_text",
    "action_features",
    "entry_features",
    "typed_match",
    "distinct_actions",
    "previous_actions",
    "encode_texts",
    "STATE_TEXT",
    "ACTION_TEXT",
    "TAP_TARGET",
    "TYPED_MATCH",
    "LIST_ENTRY",
]

# The text features appended to the VLM's, in order (each d_model wide).
STATE_TEXT = ("goal", "previous action type", "previous typed text")
ACTION_TEXT = ("action type", "typed text")
TAP_TARGET = "tapped element"  # with critic.tap_targets, after ACTION_TEXT
# With critic.typed_match, last: two numbers per candidate (typed_match).
TYPED_MATCH = ("share of the typed text found in the goal", "typed text in the goal verbatim")
# With critic.list_entries, after them: two numbers per candidate (entry_features).
LIST_ENTRY = ("the tap lands on a list's entry", "1 / (1 + the entry's place in its list)")


def action_text(action: str) -> tuple[str, str]:
    """(type, typed text) of an action string; one that does not parse is its own text for both, as in Digi-Q.

    So a malformed candidate reads as the garbage it is rather than as an
    empty action.
    """
    parsed = parse_action(action)
    return (parsed.type.name, parsed.text) if parsed.is_valid else (action, action)


def entry_features(hits: Sequence[Tapped]) -> np.ndarray:
    """(len(hits), 2): the :data:`LIST_ENTRY` numbers, (1, 1 / (1 + k)) for a tap on entry k of a list, else (0, 0).

    A results page's entries differ in their labels, not in anything that
    says which comes first; a VLM sees the order, the tiny one here does not.
    Select-the-first-entry tasks hinge on it: without it a critic can only
    value the rewarded tap on the first product like the unrewarded taps on
    the others. The first number keeps "no entry" apart from a deep one.
    """
    rows = [(1.0, 1.0 / (1 + hit.entry)) if hit.entry >= 0 else (0.0, 0.0) for hit in hits]
    return np.array(rows, np.float32).reshape(-1, 2)


def typed_match(goal: str, action: str) -> tuple[float, float]:
    """How much of a TYPE candidate's text the goal holds: (share of its characters found in the goal in order, 1.0 if whole).

    Both are 0 for other actions and empty texts; case is ignored. A
    pretrained language model tells "seagate 2tb" from "ateseag 2tbse"; the
    token averages of the tiny T5 here barely do. AitW's
    typing tasks type words of the goal (queries, addresses), which is what
    these two numbers measure; TD still learns when typing them pays.
    """
    parsed = parse_action(action)
    typed = parsed.text.strip().casefold() if parsed.is_valid and parsed.type is ActionType.TYPE else ""
    if not typed:
        return 0.0, 0.0
    text = goal.casefold()
    found = sum(block.size for block in SequenceMatcher(None, typed, text, autojunk=False).get_matching_blocks())
    return found / len(typed), float(typed in text)


def distinct_actions(action_lists: Sequence[Sequence[str]], targets: Sequence[str] | None = None) -> np.ndarray:
    """(S, N) bool: whether each candidate is the first in its state's list to do what it does.

    Half of the 16 candidates repeat another (Back alone is a quarter of
    them). A term that sums over the list counts an action as often as it was
    sampled, so stage 06's conservative term scores only these. An action is
    its parsed decision (a garbled plan before it changes nothing) and, with
    ``targets`` (each tap's element label, flat over the states' candidates), a tap
    is the element it lands on, wherever inside it. A candidate that does not
    parse is its own text.
    """
    keys = iter(targets) if targets is not None else None
    out = []
    for actions in action_lists:
        seen: set[object] = set()
        row = []
        for text in actions:
            parsed = parse_action(text)
            target = next(keys) if keys is not None else None
            key: object = text
            if parsed.is_valid:
                key = ("tap", target) if target is not None and parsed.is_tap else format_action(parsed)
            row.append(key not in seen)
            seen.add(key)
        out.append(row)
    return np.array(out, bool)


def previous_actions(steps: pd.DataFrame) -> list[str]:
    """The action before each step in its trajectory ("" at its first step); ``steps`` sorted by (traj_id, step_id)."""
    traj, action = steps.traj_id.to_numpy(), steps.action.tolist()
    return ["" if i == 0 or traj[i - 1] != traj[i] else action[i - 1] for i in range(len(action))]


def encode_texts(policy: AutoUIPolicy, texts: Sequence[str], batch: int = 256) -> np.ndarray:
    """(len(texts), d_model) text features; each distinct text is encoded once (goals and types repeat a lot)."""
    distinct = sorted(set(texts))
    rows: dict[str, np.ndarray] = {}
    for i in range(0, len(distinct), batch):
        chunk = distinct[i : i + batch]
        rows.update(zip(chunk, policy.text_features(chunk).float().cpu().numpy(), strict=True))
    width = policy.cfg.d_model
    return np.stack([rows[t] for t in texts]).astype(np.float32) if texts else np.zeros((0, width), np.float32)


def action_features(policy: AutoUIPolicy, actions: Sequence[str]) -> np.ndarray:
    """The :data:`ACTION_TEXT` features of each action: (len(actions), 2 * d_model)."""
    types, typed = zip(*map(action_text, actions), strict=True) if actions else ((), ())
    return np.concatenate([encode_texts(policy, types), encode_texts(policy, typed)], 1)
