"""Small Sokoban levels, generated solvable, with a shortest solution from a breadth-first solver.

A level is drawn by placing boxes on their goals and walking the player backwards through random moves
and *pulls* (the reverse of pushes), so every drawn level is solvable; the BFS solver then confirms it and
gives the reference, a shortest move string. A level is kept only if no box starts on a goal and the
solver finishes within :data:`MAX_STATES` states.

The prompt shows the map as text: ``#`` wall, ``_`` floor, ``.`` goal, ``$`` box, ``*`` box on a goal,
``@`` the player, ``+`` the player on a goal (``parse_level`` also reads a space or ``-`` as floor). The
answer is a move string over ``U D L R``; case, spaces, commas and arrows' separators are ignored, and
the words ``up``/``down``/``left``/``right`` read as their letters. The whole completion is read as the
move string if it is one; otherwise the contents of its last ``\\boxed{}``, then its last non-empty line,
then what follows the last colon on that line (``Moves: R, R, U.``), trailing full stops dropped.

Scoring by simulation: 1 if every move is legal and every box ends on a goal; 0.1 if the move string
parses but the level is not solved (a blocked move — into a wall, or pushing a box into a wall or another
box — ends the simulation there and the answer counts as unsolved); 0 if no move string parses.
Components: ``format``, ``correct``, ``legal`` (no blocked move), ``boxes_on_goals`` (fraction, where the
simulation stopped).

Options: ``width`` and ``height`` (5–9, walls included, default 6), ``boxes`` (1–3, default 2).
The problem's ``answer`` is the reference solution; ``meta["level"]`` is the map as a list of rows.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import re
from collections.abc import Iterator, Sequence

from echo_runtime.tasks import answers, base, options, scoring, splits

NAME = "sokoban"
MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
MAX_STATES = 200_000
"""The solver gives up (and the generator redraws) past this many explored states."""

Cell = tuple[int, int]
_MOVE_STRING = re.compile(r"[UDLRudlr]+")
_SEPARATORS = re.compile(r"[\s,;]+|->|\u2192")
_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R"}
_MAX_ANSWER_CHARS = 4000
"""Longer candidates are not read: no level needs that many moves, and it bounds the verifier's work."""


@dataclasses.dataclass(frozen=True)
class Level:
    """A map (``floor`` is every cell that is not a wall; anything else, off the map too, is wall)."""

    height: int
    width: int
    floor: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    def solved(self) -> bool:
        return self.boxes == self.goals


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Where a move string leaves a level: the state, and the index of the first blocked move if any."""

    level: Level
    blocked_at: int | None


def parse_level(rows: Sequence[str]) -> Level:
    """Read a map in the notation above; a ValueError says what is wrong with it."""
    floor: set[Cell] = set()
    goals: set[Cell] = set()
    boxes: set[Cell] = set()
    players: list[Cell] = []
    for r, row in enumerate(rows):
        for c, char in enumerate(row):
            if char == "#":
                continue
            if char not in "_ -.$*@+":
                raise ValueError(f"row {r + 1}, column {c + 1}: unknown map character {char!r}")
            floor.add((r, c))
            if char in ".*+":
                goals.add((r, c))
            if char in "$*":
                boxes.add((r, c))
            if char in "@+":
                players.append((r, c))
    if len(players) != 1:
        raise ValueError(f"a map needs exactly one player (@ or +), found {len(players)}")
    if not boxes or len(boxes) != len(goals):
        raise ValueError(f"a map needs as many goals as boxes, and at least one; got {len(boxes)} boxes")
    width = max((len(row) for row in rows), default=0)
    return Level(len(rows), width, frozenset(floor), frozenset(goals), frozenset(boxes), players[0])


def render(level: Level) -> list[str]:
    """The map's rows in the notation above."""
    rows = []
    for r in range(level.height):
        chars = []
        for c in range(level.width):
            cell = (r, c)
            if cell not in level.floor:
                chars.append("#")
            elif cell == level.player:
                chars.append("+" if cell in level.goals else "@")
            elif cell in level.boxes:
                chars.append("*" if cell in level.goals else "$")
            else:
                chars.append("." if cell in level.goals else "_")
        rows.append("".join(chars))
    return rows


def step(level: Level, move: str) -> Level | None:
    """The level after one move (``U``/``D``/``L``/``R``), or None if the move is blocked."""
    dr, dc = MOVES[move]
    pr, pc = level.player
    target = (pr + dr, pc + dc)
    if target not in level.floor:
        return None
    boxes = level.boxes
    if target in boxes:
        beyond = (pr + 2 * dr, pc + 2 * dc)
        if beyond not in level.floor or beyond in boxes:
            return None
        boxes = (boxes - {target}) | {beyond}
    return dataclasses.replace(level, boxes=boxes, player=target)


def simulate(level: Level, moves: str) -> Outcome:
    """Play ``moves`` (upper-case ``UDLR`` only) from ``level``, stopping at the first blocked move."""
    for index, move in enumerate(moves):
        after = step(level, move)
        if after is None:
            return Outcome(level, index)
        level = after
    return Outcome(level, None)


def solve(level: Level, max_states: int = MAX_STATES) -> str | None:
    """A shortest solution, by breadth-first search over (player, boxes); None if none within the cap.

    Pushes that put a box where it can never reach a goal (see :func:`_live_cells`) are pruned, which
    removes most of the state space of a small level without losing any solution.
    """
    # Cells as integers with a row stride one wider than the map, so that a step off either side of a
    # row lands on a cell that is never floor instead of wrapping round.
    stride = level.width + 1
    floor = frozenset(r * stride + c for r, c in level.floor)
    goals = frozenset(r * stride + c for r, c in level.goals)
    live = _live_cells(floor, goals, stride)
    deltas = [(move, dr * stride + dc) for move, (dr, dc) in MOVES.items()]
    start = (level.player[0] * stride + level.player[1], frozenset(r * stride + c for r, c in level.boxes))
    parents: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], str] | None] = {start: None}
    queue = collections.deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        if boxes == goals:
            path = []
            link = parents[state]
            while link is not None:
                state, move = link
                path.append(move)
                link = parents[state]
            return "".join(reversed(path))
        for move, delta in deltas:
            target = player + delta
            if target not in floor:
                continue
            after = boxes
            if target in boxes:
                beyond = target + delta
                if beyond not in live or beyond in boxes:
                    continue
                after = (boxes - {target}) | {beyond}
            key = (target, after)
            if key not in parents:
                if len(parents) >= max_states:
                    return None
                parents[key] = (state, move)
                queue.append(key)
    return None


def _live_cells(floor: frozenset[int], goals: frozenset[int], stride: int) -> frozenset[int]:
    """The cells from which a lone box could be pushed onto some goal (walls alone considered)."""
    live = set(goals)
    todo = list(goals)
    while todo:
        cell = todo.pop()
        for delta in (-stride, stride, -1, 1):
            # The box came from cell - delta, pushed by a player standing at cell - 2 * delta.
            before, pusher = cell - delta, cell - 2 * delta
            if before in floor and pusher in floor and before not in live:
                live.add(before)
                todo.append(before)
    return frozenset(live)


def _as_moves(text: str) -> str | None:
    words = _SEPARATORS.split(text.strip().rstrip(".").strip())
    letters = "".join(_WORDS.get(w.lower(), w) for w in words if w)
    return letters.upper() if _MOVE_STRING.fullmatch(letters) else None


def parse_moves(completion: str) -> str | None:
    """The move string a completion gives (upper case), or None (see the module docstring)."""
    candidates = [completion]
    inside = answers.boxed(completion)
    if inside is not None:
        candidates.append(inside)
    lines = [line for line in completion.splitlines() if line.strip()]
    if lines:
        candidates += [lines[-1], lines[-1].rpartition(":")[2]]
    for candidate in candidates:
        if len(candidate) <= _MAX_ANSWER_CHARS:
            moves = _as_moves(candidate)
            if moves is not None:
                return moves
    return None


class Sokoban:
    """Sokoban levels; see the module docstring."""

    name = NAME

    def __init__(self, *, width: int = 6, height: int = 6, boxes: int = 2) -> None:
        self.width = options.integer(NAME, "width", width, 5, 9)
        self.height = options.integer(NAME, "height", height, 5, 9)
        self.boxes = options.integer(NAME, "boxes", boxes, 1, 3)

    def _draw(self, rand: random.Random) -> Level | None:
        interior = [(r, c) for r in range(1, self.height - 1) for c in range(1, self.width - 1)]
        walls = set(rand.sample(interior, rand.randint(0, len(interior) // 6)))
        floor = frozenset(cell for cell in interior if cell not in walls)
        if len(floor) < 2 * self.boxes + 2 or not _connected(floor):
            return None
        goals = frozenset(rand.sample(sorted(floor), self.boxes))
        player = rand.choice(sorted(floor - goals))
        level = _pull_walk(Level(self.height, self.width, floor, goals, goals, player), rand)
        # A box that starts on a goal makes the level easier than it looks; redraw instead.
        return None if level.boxes & level.goals else level

    def _finish(self, level: Level, split: base.Split) -> base.Problem | None:
        solution = solve(level)
        if solution is None:
            return None
        rows = render(level)
        prompt = _prompt(rows)
        return base.Problem(
            splits.problem_id(NAME, prompt), prompt, solution, {"split": split, "level": rows}
        )

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        return splits.stream(
            NAME, split, seed, self._draw, lambda level: _prompt(render(level)), self._finish
        )

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        moves = parse_moves(completion)
        if moves is None:
            return scoring.graded(False, False, "no move string (letters U, D, L, R) found")
        level = parse_level(problem.meta["level"])
        outcome = simulate(level, moves)
        on_goals = len(outcome.level.boxes & outcome.level.goals)
        legal = outcome.blocked_at is None
        solved = legal and outcome.level.solved()
        if not legal:
            index = outcome.blocked_at or 0
            reason = f"move {index + 1} ({moves[index]}) is blocked"
        else:
            reason = f"{on_goals} of {len(level.goals)} boxes on goals after {len(moves)} moves"
        extra = {"legal": 1.0 if legal else 0.0, "boxes_on_goals": on_goals / len(level.goals)}
        return scoring.graded(True, solved, reason, **extra)

    def reference(self, problem: base.Problem) -> str:
        return str(problem.answer)


def _connected(floor: frozenset[Cell]) -> bool:
    start = min(floor)
    seen = {start}
    todo = [start]
    while todo:
        r, c = todo.pop()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if nxt in floor and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return len(seen) == len(floor)


def _pull_walk(level: Level, rand: random.Random) -> Level:
    """Walk the player at random from a solved level, pulling boxes behind it most of the time.

    Every pull undoes a legal push, so the level reached can be pushed back to the solved one.
    """
    player, boxes = level.player, set(level.boxes)
    for _ in range(rand.randint(20, 10 * (level.width + level.height))):
        dr, dc = rand.choice(list(MOVES.values()))
        target = (player[0] + dr, player[1] + dc)
        if target not in level.floor or target in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rand.random() < 0.8:
            boxes.remove(behind)
            boxes.add(player)
        player = target
    return dataclasses.replace(level, boxes=frozenset(boxes), player=player)


def _prompt(rows: Sequence[str]) -> str:
    return "\n".join(
        [
            "Sokoban: push every box onto a goal. You move one step at a time and push a box by walking"
            " into it; you cannot pull a box, push two boxes, or push a box into a wall.",
            "Map (# wall, _ floor, . goal, $ box, * box on goal, @ you, + you on goal):",
            *rows,
            "Answer with your moves on one line, using U (up), D (down), L (left), R (right).",
            "",  # the prompt ends with a newline: the answer starts on a line of its own
        ]
    )
