"""The task registry with every task of the study in it: import from here, not from
`distillab.tasks.base`, to find a task by name (`get`), the domain's task (`domain_task`)
or the evaluation's tasks (`scored`).

Importing this module imports each task module below, and each registers its tasks
(`base.register`) as it is imported. A new task is one module with its ``register(...)``
call and one line here.
"""

from __future__ import annotations

from distillab.tasks import countdown, files, math_task, mcq, skills  # noqa: F401  (each registers its tasks)
from distillab.tasks.base import Task, domain_task, get, register, registered, scored, unregister

#: The modules of the registered tasks, in registration order.
TASK_MODULES = (countdown, skills, mcq, math_task, files)

__all__ = ["Task", "get", "register", "unregister", "registered", "domain_task", "scored", "TASK_MODULES"]
