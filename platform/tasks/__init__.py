"""The study's tasks (PROTOCOL.md §5): what the models are trained and scored on, one
module per task behind one interface.

- `distillab.tasks.base`: the Task protocol (`Task`: items, prompt text, verifier, SFT
  demonstrations, metric keys, evaluation plan) and the task registry;
- `distillab.tasks.registry`: every task registered (import it to find a task by name);
- `distillab.tasks.countdown`: the Countdown variants (generation, solving, verification);
- `distillab.tasks.skills`: the micro prior skills, the micro OOD suite;
- `distillab.tasks.mcq`: four-option multiple choice (Science, MedReason, synthetic);
- `distillab.tasks.math_task`: long-reasoning math, answers checked by math-verify;
- `distillab.tasks.taskio`: the prompt renderer (chat templates) and local task files;
- `distillab.tasks.data`: a trial's task data (`TaskData`: test splits, the exclusion set,
  training prompts per role and rank, RLVR problems).

A new task is one module here (its settings, its `base.Task` subclass with its
`config.TaskEntry`, ``register(...)``), its line in `registry`, and its tests
(docs/layout.md, "Adding a task"). Import the submodules directly; this package's
``__init__`` imports nothing.
"""
