"""Stage 00: renaming the words a demonstration copies from its goal."""

import os
import random
import subprocess
import sys

import pytest

from digiq.env.actions import format_action, press_enter, tap, type_text
from digiq.models.policy_fit import FitRow
from digiq.stages.base_policy import randomize_copied_words


def _typed(action: str) -> str:
    return action.split('"typed_text": "')[1].rstrip('"')


_RENAME_IN_A_FRESH_INTERPRETER = """
import random
from digiq.env.actions import format_action, type_text
from digiq.stages.base_policy import randomize_copied_words
from digiq.models.policy_fit import FitRow
goal = 'Go to walmart.com, search for "kindle paperwhite signature edition black"'
row = FitRow("Previous Actions:  Goal: " + goal, "a.png", format_action(type_text("kindle paperwhite signature edition black")))
rng = random.Random(0)
print([randomize_copied_words(row, rng, p=0.5).action for _ in range(30)])
"""


def test_renaming_does_not_depend_on_the_interpreters_string_hashing():
    # Set order follows PYTHONHASHSEED, which Python draws anew per process: stage 00 must not, or every
    # `dvc repro` trains another base policy from the same demonstrations and seed.
    runs = {
        subprocess.run(
            [sys.executable, "-c", _RENAME_IN_A_FRESH_INTERPRETER],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(runs) == 1


def test_copied_words_are_renamed_alike_in_goal_typed_text_and_previous_action():
    goal = 'Go to walmart.com, search for "Kindle paperwhite"'
    typing = FitRow(f"Previous Actions: {format_action(tap(0.1, 0.5))} Goal: {goal}", "a.png",
                    format_action(type_text("kindle paperwhite")))  # fmt: skip
    after = FitRow(f"Previous Actions: {typing.action} Goal: {goal}", "b.png", format_action(press_enter()))
    rng = random.Random(0)
    for _ in range(20):
        new = randomize_copied_words(typing, rng, p=1.0)
        typed = _typed(new.action)
        assert len(typed.split()) == 2 and "kindle" not in typed and "paperwhite" not in typed
        assert new.prompt.endswith(f'search for "{typed.split()[0].capitalize()} {typed.split()[1]}"')
        assert "walmart.com" in new.prompt and new.image_path == "a.png"  # words not typed stay
        assert new.prompt.startswith(f"Previous Actions: {format_action(tap(0.1, 0.5))} Goal: Go to walmart.com")
        nxt = randomize_copied_words(after, rng, p=1.0)
        assert nxt.action == after.action
        assert _typed(nxt.prompt.split(" Goal: ")[0]) in nxt.prompt.split(" Goal: ")[1].lower()
    assert randomize_copied_words(typing, rng, p=0.0) == typing
    no_typing = FitRow(f"Previous Actions:  Goal: {goal}", "c.png", format_action(tap(0.2, 0.3)))
    assert randomize_copied_words(no_typing, rng, p=1.0) == no_typing
    with pytest.raises(ValueError, match="without ' Goal: '"):
        randomize_copied_words(FitRow("Goal missing", "d.png", typing.action), rng)
