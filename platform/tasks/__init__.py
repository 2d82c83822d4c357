"""The study's tasks (PROTOCOL.md §5): what the models are trained and scored on.

- `distillab.tasks.countdown`: Countdown generation, solving and verification, and the
  micro prior skills (the micro OOD suite);
- `distillab.tasks.mcq`: four-option multiple choice (Science, MedReason, synthetic);
- `distillab.tasks.math_task`: long-reasoning math, answers checked by math-verify;
- `distillab.tasks.taskio`: prompt rendering (chat templates) and local task files;
- `distillab.tasks.data`: a trial's task data (`TaskData`: test splits, the exclusion set,
  training prompts per role and rank, RLVR problems).

A new task goes here: its primitives in a module of its own, its test split and training
items in `TaskData`, its scoring in `distillab.evals.suite`, its config in `distillab.config`.
Import the submodules directly; this package's ``__init__`` imports nothing.
"""
