import pytest
from hypothesis import given
from hypothesis import strategies as st

from digiq.env.actions import (
    Action,
    ActionType,
    format_action,
    parse_action,
    press_back,
    swipe,
    tap,
    type_text,
)

coord = st.floats(0, 1, allow_nan=False).map(lambda v: round(v, 4))
point = st.tuples(coord, coord)
valid_actions = st.one_of(
    point.map(lambda p: tap(*p)),
    st.tuples(point, point).map(lambda pq: swipe(*pq)),
    st.text(min_size=1).map(type_text),
    st.sampled_from(
        [
            ActionType.PRESS_BACK,
            ActionType.PRESS_HOME,
            ActionType.PRESS_ENTER,
            ActionType.STATUS_TASK_COMPLETE,
            ActionType.STATUS_TASK_IMPOSSIBLE,
        ]
    ).map(Action),
)


@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1"))))
def test_parse_never_raises_on_arbitrary_text(text):
    a = parse_action(text)
    assert isinstance(a, Action)
    assert a.is_valid or a.error


@given(valid_actions)
def test_valid_actions_round_trip(action):
    assert parse_action(format_action(action)) == action


def test_autoui_reference_format():
    text = format_action(tap(0.52, 0.31), plan=[ActionType.DUAL_POINT, ActionType.TYPE])
    assert text == (
        'Action Plan: [DUAL_POINT,TYPE] ; Action Decision: "action_type": "DUAL_POINT", '
        '"touch_point": "[0.5200, 0.3100]", "lift_point": "[0.5200, 0.3100]", "typed_text": ""'
    )
    t = format_action(type_text("capital of England"))
    assert '"touch_point": "[-1.0, -1.0]"' in t and t.endswith('"typed_text": "capital of England"')


def test_reads_original_autoui_output_with_y_x_order():
    out = (
        'Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", '
        '"touch_point": "[0.7853, 0.6861]", "lift_point": "[0.7853, 0.6861]", "typed_text": ""'
    )
    a = parse_action(out)
    assert a.type is ActionType.DUAL_POINT and a.touch == (0.7853, 0.6861) and a.is_tap


def test_typed_text_may_contain_quotes_and_commas():
    a = type_text('say "hi", then leave')
    assert parse_action(format_action(a)).text == 'say "hi", then leave'


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "no action_type"),
        ("tap the button", "no action_type"),
        ('"action_type": "JUMP"', "unknown action_type"),
        ('"action_type": "DUAL_POINT", "touch_point": "[0.5]", "lift_point": "[0.5, 0.5]"', "two numbers"),
        ('"action_type": "DUAL_POINT", "touch_point": "[a, b]", "lift_point": "[0.5, 0.5]"', "not numeric"),
        ('"action_type": "DUAL_POINT", "touch_point": "[1.5, 0.2]", "lift_point": "[0.5, 0.5]"', "outside [0, 1]"),
        ('"action_type": "DUAL_POINT", "touch_point": "[0.5, 0.2]"', "missing lift_point"),
        (
            '"action_type": "TYPE", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""',
            "empty",
        ),
        (None, "expected a string"),
    ],
)
def test_malformed_output_is_invalid_with_reason(text, why):
    a = parse_action(text)
    assert a.type is ActionType.INVALID and why in a.error


def test_tap_versus_swipe_threshold():
    assert tap(0.5, 0.5).is_tap
    assert swipe((0.5, 0.5), (0.51, 0.52)).is_tap  # within AitW's 0.04
    s = swipe((0.8, 0.5), (0.3, 0.5))
    assert s.is_swipe and not s.is_tap
    assert not press_back().is_tap


def test_invalid_action_cannot_be_formatted():
    with pytest.raises(ValueError, match="invalid"):
        format_action(parse_action("garbage"))
