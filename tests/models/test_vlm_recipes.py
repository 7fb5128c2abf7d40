"""The two ways of showing and asking the VLM a (screen, action) pair, checked against references built here."""

import numpy as np
import pytest
from PIL import Image

from digiq.env.actions import press_back, press_home, swipe, tap, type_text
from digiq.models.vlm_recipes import OriginalRecipe, TinyRecipe, click_icon, recipe

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's image statistics, which LLaVA-1.5's processor uses
SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
ONLY = "Respond only 'Yes' or 'No' (without period / quotation marks) and don't respond anything else."


def test_original_questions_are_digiqs_per_action_type_and_leave_the_task_out():
    r = OriginalRecipe(336, CLIP_MEAN)
    ui = "<image>\nYou're given a user interface."
    assert r.question(tap(0.4552, 0.4869), "Open Gmail") == (
        f"{ui} There is a cursor in the screen. The touch point is located at [0.4552, 0.4869] "
        f"Is this cursor Clicking on any interactive elements?\n{ONLY}"
    )
    assert r.question(swipe((0.8, 0.5), (0.2, 0.5)), "x").startswith(f"{ui} There is a cursor in the screen.")
    assert r.question(type_text("jazz"), "x") == (
        f"{ui} If a user now Types jazz, will this Type action effectively input the text into somewhere on the "
        f"Screenshot?\n{ONLY}"
    )
    assert r.question(press_home(), "x") == (
        f"{ui} If a user now Presses the <HOME> button, will this action effectively navigate the user to the Home "
        f"screen?\n{ONLY}"
    )
    assert r.question(press_back(), "x").endswith("navigate the user to the previous screen?\n" + ONLY)
    assert r.template("<image>\nQ") == f"{SYSTEM} USER: <image>\nQ ASSISTANT:" and r.bos
    tiny = TinyRecipe(96)
    assert tiny.template("<image>\nQ") == "<image>\nQ" and not tiny.bos
    assert tiny.question(tap(0.4552, 0.4869), "Open Gmail") == (
        "<image>\nTask: Open Gmail\nDoes tapping at the red circle, at [0.4552, 0.4869], change the screen? Answer:"
    )
    assert "from [0.8, 0.5] to [0.2, 0.5]," in tiny.question(swipe((0.8, 0.5), (0.2, 0.5)), "x")
    # The experiment's recipe asks the same without the point; the marker is drawn alike.
    unplaced = recipe("tiny_no_point", 96, CLIP_MEAN, "{}")
    assert unplaced.name == "tiny_no_point" and unplaced.parts == tiny.parts
    assert unplaced.question(tap(0.4552, 0.4869), "Open Gmail") == (
        "<image>\nTask: Open Gmail\nDoes tapping at the red circle, change the screen? Answer:"
    )
    assert unplaced.question(swipe((0.8, 0.5), (0.2, 0.5)), "x").endswith("swiping along the red line, change the "
                                                                        "screen? Answer:")  # fmt: skip
    assert unplaced.question(press_home(), "x") == tiny.question(press_home(), "x")
    screen = np.zeros((96, 96, 3), np.uint8)
    assert np.array_equal(unplaced.mark(screen, tap(0.3, 0.6)), tiny.mark(screen, tap(0.3, 0.6)))


def test_original_image_is_a_quarter_size_screen_padded_to_a_square_in_the_mean_colour():
    screen = np.zeros((456, 216, 3), np.uint8)
    screen[:, :, 1] = 200  # green everywhere
    r = OriginalRecipe(114, CLIP_MEAN)  # the padded square's own size: no resize after padding
    shown = r.state(r.base([screen])[0])
    # 1/4 of 456 x 216 is 114 x 54, centred in a 114 x 114 square: 30 columns of padding on each side.
    mean = np.array([int(m * 255) for m in CLIP_MEAN])
    assert shown.shape == (114, 114, 3)
    assert (shown[:, :30] == mean).all() and (shown[:, 84:] == mean).all()
    assert (shown[:, 30:84] == (0, 200, 0)).all()
    assert r.mark(screen, swipe((0.8, 0.5), (0.2, 0.5))).tobytes() == shown.tobytes()  # only taps get the icon
    assert r.mark(screen, type_text("a")).tobytes() == shown.tobytes()


def test_original_tap_pastes_the_click_icon_at_full_size_before_scaling():
    screen = np.full((456, 216, 3), 255, np.uint8)
    r = OriginalRecipe(114, CLIP_MEAN)
    marked = r.mark(screen, tap(0.25, 0.5))  # touch point (y, x) = (114, 108) in full-size pixels
    changed = np.argwhere((marked != r.state(screen)).any(-1))
    # The icon is 250/1080 of the width (50 px here), centred on the touch point, then scaled by 1/4 and
    # shifted right by the 30 columns of padding: rows 89-139 / 4, columns 30 + 83-133 / 4, up to resampling.
    (top, left), (bottom, right) = changed.min(0), changed.max(0)
    assert 20 <= top <= 23 and 34 <= bottom <= 36 and 49 <= left <= 52 and 63 <= right <= 65
    icon = np.asarray(click_icon())
    assert icon.shape == (250, 250, 4) and icon[125, 125, 3] == 255 and icon[0, 0, 3] == 0  # opaque disc, clear corners


def test_recipes_are_named_and_checked():
    assert isinstance(recipe("tiny", 96, CLIP_MEAN, "{}"), TinyRecipe)
    assert isinstance(recipe("original", 336, CLIP_MEAN, "{}"), OriginalRecipe)
    with pytest.raises(ValueError, match="unknown VLM recipe 'llava'"):
        recipe("llava", 96, CLIP_MEAN, "{}")


def test_tiny_recipe_resizes_whole_and_marks_in_red():
    screen = np.asarray(Image.new("RGB", (216, 456), (0, 0, 255)))
    r = TinyRecipe(32)
    (small,) = r.base([screen])
    assert small.shape == (32, 32, 3) and (small == (0, 0, 255)).all()
    assert (r.mark(small, tap(0.5, 0.5)) != small).any() and r.state(small) is small
    ring = np.argwhere((TinyRecipe(96).mark(np.zeros((96, 96, 3), np.uint8), tap(0.5, 0.5)) != 0).any(-1))
    assert 22 <= ring[:, 1].max() - ring[:, 1].min() + 1 <= 24  # about 250/1080 of 96 px, as Digi-Q's click icon
