"""Sokoban: hand-written levels and solutions, the simulator's rules, and solvable generated levels."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.tasks import base, scoring, sokoban

TASK = sokoban.Sokoban()
CORRIDOR = [
    "#######",
    "#@_$_.#",
    "#######",
]
TWO_BOXES = [
    "######",
    "#_.._#",
    "#_$$_#",
    "#__@_#",
    "######",
]


def hand(rows: list[str]) -> base.Problem:
    return base.Problem("hand", "(hand)", "", {"level": rows})


@pytest.mark.parametrize(
    ("completion", "value", "legal", "on_goals"),
    [
        ("RRR", 1.0, 1.0, 1.0),
        ("r r r", 1.0, 1.0, 1.0),
        ("R, R, R\n", 1.0, 1.0, 1.0),
        ("I walk right twice and push once.\nRRR", 1.0, 1.0, 1.0),
        ("RR", scoring.FORMAT_CREDIT, 1.0, 0.0),  # one push short
        ("RRRR", scoring.FORMAT_CREDIT, 0.0, 1.0),  # the last push is into the wall
        ("LRRR", scoring.FORMAT_CREDIT, 0.0, 0.0),  # the first move walks into a wall
        ("RRRL", 1.0, 1.0, 1.0),  # walking back afterwards leaves the box on its goal
        ("", 0.0, 0.0, 0.0),
        ("RRX", 0.0, 0.0, 0.0),
        ("right right right", 1.0, 1.0, 1.0),  # the words a real model writes
        ("Moves: R, R, R.", 1.0, 1.0, 1.0),
        ("The solution is \\boxed{RRR}, I think.", 1.0, 1.0, 1.0),
        ("Right -> Right -> Right", 1.0, 1.0, 1.0),
        ("go right", 0.0, 0.0, 0.0),
    ],
)
def test_hand_written_corridor(completion: str, value: float, legal: float, on_goals: float) -> None:
    reward = TASK.score(hand(CORRIDOR), completion)
    assert reward.value == value
    if reward.components["format"]:
        assert reward.components["legal"] == legal
        assert reward.components["boxes_on_goals"] == on_goals
    assert (reward.reason == "") == (value == 1.0)


def test_hand_written_two_box_level() -> None:
    # Push the right box up from where we stand, step down and left, push the left box up: 4 moves,
    # and no shorter way exists (two pushes, and the player must get under the second box).
    problem = hand(TWO_BOXES)
    assert TASK.score(problem, "UDLU").value == 1.0
    assert TASK.score(problem, "LUDRU").value == 1.0  # longer but fine
    wrong = TASK.score(problem, "UDLD")
    assert wrong.value == scoring.FORMAT_CREDIT
    assert wrong.components["boxes_on_goals"] == 0.5
    blocked = TASK.score(problem, "UU")  # the second push would put the box into the wall
    assert blocked.components["legal"] == 0.0
    assert "move 2 (U) is blocked" in blocked.reason
    into_box = TASK.score(problem, "LLUR")  # from the left, the left box would be pushed into the right one
    assert into_box.components["legal"] == 0.0
    assert "move 4 (R) is blocked" in into_box.reason
    solution = sokoban.solve(sokoban.parse_level(TWO_BOXES))
    assert solution is not None and len(solution) == 4
    assert TASK.score(problem, solution).value == 1.0


def test_pushing_two_boxes_is_blocked() -> None:
    level = sokoban.parse_level(["#######", "#@$$..#", "#######"])
    assert sokoban.step(level, "R") is None
    assert sokoban.solve(level) is None


def test_a_box_in_a_corner_is_unsolvable() -> None:
    assert sokoban.solve(sokoban.parse_level(["#####", "#$_.#", "#@__#", "#####"])) is None


def test_maps_without_a_border_do_not_wrap_round() -> None:
    # Off the map is wall, so the box in the top-right corner is stuck. A solver whose cell numbering
    # wrapped round the row end would push it "right" onto the goal at the start of the next row.
    level = sokoban.parse_level(["_@$", ".__"])
    assert sokoban.step(level, "R") is None
    assert sokoban.solve(level) is None


def test_render_inverts_parse() -> None:
    rows = ["#####", "#+$_#", "#_*_#", "#$._#", "#####"]
    assert sokoban.render(sokoban.parse_level(rows)) == rows
    assert sokoban.render(sokoban.parse_level([r.replace("_", " ") for r in rows])) == rows


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["#@@.$#"], "exactly one player"),
        (["#_.$#"], "exactly one player"),
        (["#@.$$#"], "as many goals as boxes"),
        (["#@__#"], "as many goals as boxes, and at least one"),
        (["#@.$x#"], "row 1, column 5: unknown map character 'x'"),
    ],
)
def test_bad_maps_are_rejected_with_a_reason(rows: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sokoban.parse_level(rows)


@pytest.mark.parametrize("options", [{}, {"boxes": 1}, {"width": 8, "height": 7, "boxes": 3}])
def test_generated_levels_are_solvable_and_well_shaped(options: dict[str, int]) -> None:
    task = sokoban.Sokoban(**options)
    for split in ("train", "heldout"):
        for p in itertools.islice(task.prompts(split, 0), 30 if options.get("boxes", 2) < 3 else 8):
            rows = p.meta["level"]
            assert "\n".join(rows) in p.prompt
            assert len(rows) == task.height and {len(r) for r in rows} == {task.width}
            assert rows[0] == rows[-1] == "#" * task.width
            level = sokoban.parse_level(rows)
            assert len(level.boxes) == task.boxes
            assert not level.boxes & level.goals
            # Solvable, checked by simulation rather than by trusting the solver.
            end = sokoban.simulate(level, p.answer)
            assert end.blocked_at is None and end.level.solved()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), cut=st.integers(1, 4))
def test_a_shortened_solution_scores_below_one(seed: int, cut: int) -> None:
    # The reference is a shortest solution, so no proper prefix of it can solve the level.
    p = next(TASK.prompts("train", seed))
    assert TASK.score(p, TASK.reference(p)).value == 1.0
    assert TASK.score(p, p.answer[: max(0, len(p.answer) - cut)]).value < 1.0


@settings(max_examples=150, deadline=None)
@given(moves=st.text(alphabet="UDLRudlr ,\n"))
def test_any_move_string_scores_without_raising(moves: str) -> None:
    reward = TASK.score(hand(TWO_BOXES), moves)
    assert reward.value in (0.0, scoring.FORMAT_CREDIT, 1.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"width": 4}, "option 'width' must be an integer from 5 to 9"),
        ({"height": 10}, "option 'height' must be an integer from 5 to 9"),
        ({"boxes": 0}, "option 'boxes' must be an integer from 1 to 3"),
    ],
)
def test_bad_options_say_what_is_allowed(options: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sokoban.Sokoban(**options)
