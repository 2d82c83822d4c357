"""The micro prior skills as a task (PROTOCOL.md §4, §8): the micro OOD suite.

What the micro student knows before distillation (`tasks.countdown.SKILLS`: add, mul,
reverse, sort; the ones of ``tasks.ood_skills``), trained into it by `prepare` and scored at
every stage by the OOD backend (`evals.ood.MicroSkillsBackend`: a row per skill and their
mean, ``ood_mean``, whose change is forgetting). Registered as task ``ood``: its settings are
``tasks.ood_skills``, its rows ``ood/<skill>``; a prompt is the item's text with no system
prompt, scored by exact match of the ``<answer>``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from distillab.config import EvaluationConfig, TasksConfig
from distillab.config.tasks import task_entry
from distillab.registry import FORGETTING_EVAL, eval_key
from distillab.tasks.base import EvalPlan, Task, register
from distillab.tasks.countdown import SkillItem, generate_skill_items, score_skill

__all__ = ["PriorSkillsTask", "SKILLS_TASK", "OOD_MAX_TOKENS"]

#: Longest completion of a prior-skill answer (tokens): ``<answer>`` + a few characters + ``</answer>``.
OOD_MAX_TOKENS = 16


class PriorSkillsTask(Task):
    """The prior skills of ``tasks.ood_skills`` (module docstring). Items come per skill, in
    ``ood_skills`` order (``n`` of each); training items may hold test items (the skills are
    the student's prior knowledge, not a task it is distilled on, and every recorded student was
    trained so)."""

    sft_order = 90
    in_suite = False

    def __init__(self):
        super().__init__(task_entry("ood"))

    def test_items(self, tasks: TasksConfig, n: int) -> list[SkillItem]:
        """``n`` items of each skill, seeded by ``tasks.test_seed`` (`countdown.generate_skill_items`)."""
        return [it for skill in tasks.ood_skills for it in generate_skill_items(skill, n, tasks.test_seed)]

    def train_items(self, tasks: TasksConfig, n: int, seed: int, exclude: Iterable[Hashable] = ()) -> list[SkillItem]:
        """``n`` items of each skill drawn with ``seed``, those in ``exclude`` dropped."""
        exclude = set(exclude)
        return [it for skill in tasks.ood_skills for it in generate_skill_items(skill, n, seed) if it not in exclude]

    def system_prompt(self, tasks: TasksConfig, role: str = "student") -> str:
        """None: the item's text is the whole prompt."""
        return ""

    def user_text(self, tasks: TasksConfig, item: SkillItem, role: str = "student") -> str:
        """The item's own prompt text (``add 3 5``)."""
        return item.prompt

    def score(self, completion: str, item: SkillItem) -> bool:
        """Exact match of the ``<answer>`` (`countdown.score_skill`)."""
        return score_skill(completion, item)

    def demonstration(self, tasks: TasksConfig, item: SkillItem) -> str:
        """``<answer>`` + the expected answer + ``</answer>``."""
        return f"<answer>{item.answer}</answer>"

    def exclusion(self, tasks: TasksConfig, ev: EvaluationConfig) -> set:
        """Nothing (class docstring)."""
        return set()

    def exclusion_key(self, ev: EvaluationConfig) -> None:
        """None: nothing of the evaluation decides its training items."""
        return None

    def metrics(self) -> list[tuple[str, str]]:
        """A row per skill and the mean (``ood/<skill>/accuracy``, ``ood/ood_mean``)."""
        task, mean = FORGETTING_EVAL
        return [(eval_key("<stage>", f"{task}/<skill>", "accuracy"), "exact match on a prior skill"),
                (eval_key("<stage>", task, mean), "unweighted mean of the OOD tasks")]

    def evaluation(self, tasks: TasksConfig, ev: EvaluationConfig) -> EvalPlan:
        """``ood_items`` of each skill (``items``: all of them; 0 when ``ood_backend`` is ``lm_eval``), one
        sample each at ``ood_temperature``, top-p 1, at most `OOD_MAX_TOKENS`; no pass@k."""
        items = self.entry.items(ev) * len(tasks.ood_skills)
        return EvalPlan(items, ev.ood_items, ev.ood_temperature, 1.0, OOD_MAX_TOKENS, 0, 1, (), 1.0)


#: The prior skills' task, registered as ``ood``.
SKILLS_TASK = register(PriorSkillsTask())
