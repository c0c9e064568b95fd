"""Tasks: seeded prompt sources with exact, never-raising verifiers (see :mod:`.base` for the promises).

Built in: ``arithmetic`` (a CPU-demo task), ``knights_knaves``, ``sokoban``, ``math``, ``dataset`` (a
user's own files, :mod:`.dataset`) and ``reasoning_gym`` (any dataset of that library, an optional extra:
:mod:`.reasoning_gym`); plugins offer more under the ``echorl.tasks`` entry points; any other
task is named ``module:function``. :func:`get_task` builds one by name, :func:`from_spec` a job's,
:func:`corpus` gives tokenizer text.
"""

from echo_runtime.tasks.base import Problem, Reward, Split, Task
from echo_runtime.tasks.registry import BUILTIN_TASKS, ENTRY_POINT_GROUP, corpus, from_spec, get_task

__all__ = [
    "BUILTIN_TASKS",
    "ENTRY_POINT_GROUP",
    "Problem",
    "Reward",
    "Split",
    "Task",
    "corpus",
    "from_spec",
    "get_task",
]
