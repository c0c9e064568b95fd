"""Tasks: seeded prompt sources with exact, never-raising verifiers (see :mod:`.base` for the promises).

Built in: ``arithmetic`` (a CPU-demo task), ``knights_knaves``, ``sokoban`` and ``math``; any other task
is named ``module:function``. :func:`get_task` builds one by name, :func:`corpus` gives tokenizer text.
"""

from echo_runtime.tasks.base import Problem, Reward, Split, Task
from echo_runtime.tasks.registry import BUILTIN_TASKS, corpus, get_task

__all__ = ["BUILTIN_TASKS", "Problem", "Reward", "Split", "Task", "corpus", "get_task"]
