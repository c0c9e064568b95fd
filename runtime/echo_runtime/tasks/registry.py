"""Finding a task by name: the built-ins, installed plugins, or a user's ``module:function``.

``get_task("arithmetic", {"digits": 3})`` builds a built-in task; ``get_task("my_pkg.tasks:make", opts)``
imports ``my_pkg.tasks`` and calls ``make(**opts)``, which must return a :class:`~.base.Task`; any other
name is looked up among the entry points of the group :data:`ENTRY_POINT_GROUP` (``echorl.tasks``) of
the installed distributions — a plugin declares ``[project.entry-points."echorl.tasks"] name =
"pkg.mod:make"`` — and built the same way. Built-in names win over plugins. Every mistake is a
ValueError that names the task and says what is allowed: an unknown name lists the built-ins and the
installed plugins, an unknown option lists the task's options, a bad value says the allowed range.
:func:`from_spec` builds the task of a job's ``spec.task`` (the ``dataset`` task takes
``spec.task.dataset``). ``reasoning_gym`` (:mod:`.reasoning_gym`) needs the optional ``reasoning-gym``
extra, imported only when the task is built.

:func:`corpus` is text from every built-in task (prompts and reference completions), for training the
tiny demo model's tokenizer on exactly the characters and words the tasks use.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import itertools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from echo_runtime.tasks import arithmetic, base, dataset, knights_knaves, mathwords, reasoning_gym, sokoban

if TYPE_CHECKING:
    from echo_runtime.spec.policy import Task as TaskSpec

ENTRY_POINT_GROUP: Final = "echorl.tasks"
"""The entry-point group under which installed distributions offer tasks."""

_BUILTINS: dict[str, Callable[..., base.Task]] = {
    "arithmetic": arithmetic.Arithmetic,
    "knights_knaves": knights_knaves.KnightsKnaves,
    "sokoban": sokoban.Sokoban,
    "math": mathwords.MathWords,
    "dataset": dataset.DatasetTask,
    "reasoning_gym": reasoning_gym.ReasoningGym,
}
BUILTIN_TASKS: tuple[str, ...] = tuple(_BUILTINS)

# The corpus covers every operator and number length, not just the defaults, so that a tokenizer trained
# on it can encode any option setting.
_CORPUS_OPTIONS: dict[str, tuple[dict[str, Any], ...]] = {
    "arithmetic": ({}, {"digits": 4, "ops": "+-*", "operands": 3}),
    "knights_knaves": ({}, {"min_people": 6, "max_people": 8}),
    "sokoban": ({},),
    "math": ({},),
}


def get_task(name: str, options: Mapping[str, Any] | None = None) -> base.Task:
    """The task called ``name`` (a built-in or ``module:function``), built with ``options``."""
    given = dict(options or {})
    if not isinstance(name, str):
        raise ValueError(f"task name must be a string, got {name!r}")
    if name in _BUILTINS:
        factory = _BUILTINS[name]
        _check_option_names(name, factory, given)
        return factory(**given)
    if ":" in name:
        return _user_task(name, given)
    plugins = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if name in plugins:
        try:
            factory = plugins[name].load()
        except Exception as error:  # a broken plugin: say which and why
            raise ValueError(
                f"task {name!r}: cannot load entry point {plugins[name].value!r} ({ENTRY_POINT_GROUP}): {error}"
            ) from error
        return _build(name, factory, given)
    installed = f"; installed plugins ({ENTRY_POINT_GROUP}): {', '.join(sorted(plugins))}" if plugins else ""
    raise ValueError(
        f"unknown task {name!r}: built-in tasks are {', '.join(BUILTIN_TASKS)}{installed}; "
        f"a task of your own is named 'module:function' or offered under the {ENTRY_POINT_GROUP!r} entry points"
    )


_PROCEDURAL: Final = frozenset({"arithmetic", "knights_knaves", "sokoban", "math"})
"""Built-ins that generate their problems: building one reads nothing and takes well under a
millisecond, so :func:`check` builds them to check option values too."""


def check(name: str, options: Mapping[str, Any] | None = None, *, plugins_here: bool = False) -> None:
    """Raise ValueError for the mistakes a manifest can be checked for without running user code or
    reading data: a built-in's unknown option (with the allowed ones) or bad value, and a name that is
    none of the built-ins but close to one (with the one meant). ``plugins_here``: the process that will
    run the task is this one (``echorl run``), so a name must be a built-in, ``module:function`` or an
    entry point installed here. A plugin name in a cluster can only be checked in the pods' image."""
    given = dict(options or {})
    if name in _BUILTINS:
        _check_option_names(name, _BUILTINS[name], given)
        if name in _PROCEDURAL:
            _BUILTINS[name](**given)
        return
    if ":" in name:
        return
    plugins = sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    if name in plugins:
        return
    close = difflib.get_close_matches(name, [*BUILTIN_TASKS, *plugins], n=1, cutoff=0.8)
    if close or plugins_here:
        meant = f"did you mean {close[0]!r}? " if close else ""
        installed = f"; installed plugins ({ENTRY_POINT_GROUP}): {', '.join(plugins)}" if plugins else ""
        raise ValueError(
            f"unknown task {name!r}: {meant}built-in tasks are {', '.join(BUILTIN_TASKS)}{installed}; a task "
            f"of your own is named 'module:function' (a plugin installed only in the images, too)"
        )


def from_spec(task: TaskSpec) -> base.Task:
    """The task of a job's ``spec.task``: its name with its options (or, for ``dataset``, its dataset)."""
    return get_task(task.name, task.task_options())


def corpus(seed: int = 0, per_task: int = 2000) -> list[str]:
    """``per_task`` texts (prompt followed by reference completion) from each built-in task's train split."""
    texts: list[str] = []
    for name, settings in _CORPUS_OPTIONS.items():
        for index, setting in enumerate(settings):
            count = per_task // len(settings) + (1 if index < per_task % len(settings) else 0)
            task = get_task(name, setting)
            for problem in itertools.islice(task.prompts("train", seed), count):
                if isinstance(problem.prompt, str):  # the procedural built-ins give text prompts
                    texts.append(problem.prompt + task.reference(problem))
    return texts


def _check_option_names(name: str, factory: Callable[..., Any], given: Mapping[str, Any]) -> None:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    allowed = [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for option in given:
        if option not in allowed:
            listed = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"task {name!r}: unknown option {option!r}; allowed options: {listed}")


def _user_task(name: str, given: Mapping[str, Any]) -> base.Task:
    module_name, _, function_name = name.partition(":")
    if not module_name or not function_name.isidentifier():
        raise ValueError(
            f"task {name!r}: a task of your own is named 'module:function', e.g. 'pkg.tasks:make'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"task {name!r}: cannot import module {module_name!r}: {error}") from error
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise ValueError(f"task {name!r}: module {module_name!r} has no function {function_name!r}")
    return _build(name, factory, given)


def _build(name: str, factory: Any, given: Mapping[str, Any]) -> base.Task:
    if not callable(factory):
        raise ValueError(f"task {name!r}: {factory!r} is not callable")
    _check_option_names(name, factory, given)
    task = factory(**given)
    if not isinstance(task, base.Task):
        raise ValueError(
            f"task {name!r}: {getattr(factory, '__name__', factory)}() returned a {type(task).__name__}, not a "
            f"Task (an object with name, prompts, score and reference)"
        )
    return task
