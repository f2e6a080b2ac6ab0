"""Built-in verifiable tasks: generators, reward functions, and data set loading.

Importing the package registers the built-in tasks, so `get_task` always knows them.
`pipeline.tasks.data` (which imports HuggingFace `datasets`) is imported on demand.
"""

from pipeline.tasks import reverse, sort  # noqa: F401  (registers the tasks)
from pipeline.tasks.base import Task, get_task, prompt_id, register_task, task_names

__all__ = ["Task", "get_task", "prompt_id", "register_task", "task_names"]
