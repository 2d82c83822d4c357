"""Teacher and student: checkpoint directories, or the micro models `distillab prepare` builds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from distillab.config.base import _Strict
from distillab.config.tasks import check_module_task_counts
from distillab.config.training import RLVRConfig
from distillab.registry import COUNTDOWN_TASKS


class MicroModelConfig(_Strict):
    """A micro Llama built from config and trained by `distillab prepare`."""

    #: hidden size (a multiple of ``num_heads``, head_dim ≥ 32)
    hidden_size: int = Field(ge=32)
    #: transformer layers
    num_layers: int = Field(ge=1)
    #: attention heads
    num_heads: int = Field(ge=1)
    #: MLP width
    intermediate_size: int = Field(ge=1)
    #: longest sequence (tokens) the model is built for
    max_position_embeddings: int = Field(default=256, ge=16)
    #: SFT optimizer steps, batch (sequences) and peak LR (cosine, warm-up)
    sft_steps: int = Field(ge=1)
    #: SFT batch (sequences per optimizer step)
    sft_batch_size: int = Field(default=64, ge=1)
    #: SFT peak learning rate (cosine decay after the warm-up)
    sft_lr: float = Field(default=3e-3, gt=0)
    #: SFT warm-up steps
    sft_warmup: int = Field(default=50, ge=0)
    #: SFT data: Countdown demonstrations per task name, and examples per prior skill
    countdown_examples: dict[Literal[COUNTDOWN_TASKS], int] = {}
    #: SFT examples per prior skill (the micro OOD suite's tasks)
    skill_examples: int = Field(default=0, ge=0)
    #: multiple-choice demonstrations (``tasks.mcq``; the study's second domain)
    mcq_examples: int = Field(default=0, ge=0)
    #: worked math demonstrations (``tasks.math``; the long-reasoning domain)
    math_examples: int = Field(default=0, ge=0)
    #: Countdown-3 demonstrations under the teacher's conditioning prompt (``tasks.teacher_system_prompt`` /
    #: ``teacher_user_template``) written in the spaced style (``2 + 3 = 5, 5 * 4 = 20``): a teacher that
    #: answers in that style only when conditioned (the style-transfer experiment)
    styled_examples: int = Field(default=0, ge=0)
    #: demonstrations of each task registered by a module (task name → examples; the built-in tasks have
    #: their own fields above); absent from the dump when empty
    task_examples: dict[str, int] = Field(default={}, exclude_if=lambda v: not v)

    @field_validator("task_examples")
    @classmethod
    def _task_examples(cls, v: dict[str, int]) -> dict[str, int]:
        return check_module_task_counts(v, "task_examples", lambda e: e.examples_field)

    @model_validator(mode="after")
    def _heads(self) -> "MicroModelConfig":
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            raise ValueError(
                f"hidden_size/num_heads must be an integer >= 32 (vLLM CPU head_dim); got "
                f"{self.hidden_size}/{self.num_heads}"
            )
        return self


class ModelsConfig(_Strict):
    """Teacher and student: a checkpoint directory (Llama/Qwen, loaded with
    ``from_pretrained``) or, when the path is null, the micro model that
    `distillab prepare` builds and caches under ``cache_dir/<config hash>``."""

    #: the teacher's checkpoint directory (``from_pretrained``); null: the micro teacher of ``micro_teacher``
    teacher_path: str | None = None
    #: the student's checkpoint directory (``from_pretrained``); null: the micro student of ``micro_student``
    student_path: str | None = None
    #: where ``prepare`` caches the micro models (``<cache_dir>/<config hash>``) and trials share OffPD sets
    cache_dir: str = ".cache/models"
    #: the micro teacher's architecture and SFT (used when ``teacher_path`` is null)
    micro_teacher: MicroModelConfig = MicroModelConfig(
        hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256, sft_steps=3000,
        countdown_examples={"countdown3": 40_000, "countdown4e": 20_000},
    )
    #: the micro student's architecture and SFT (used when ``student_path`` is null)
    micro_student: MicroModelConfig = MicroModelConfig(
        hidden_size=128, num_layers=3, num_heads=4, intermediate_size=256, sft_steps=800,
        countdown_examples={"countdown3": 500}, skill_examples=20_000,
    )
    #: seed of ``prepare``'s SFT data and training
    prepare_seed: int = 0
    #: optional GRPO refinement of the teacher after SFT (PROTOCOL.md §6; `prepare.refine_teacher`):
    #: the same GRPO/DAPO code as the RLVR stage, e.g. ``correct_reward: 2.0``, ``format_reward: 0.5``
    teacher_refine: RLVRConfig | None = None

    def micro(self, role: str) -> MicroModelConfig:
        """``micro_teacher`` or ``micro_student`` (``role``: ``teacher`` or ``student``)."""
        return self.micro_teacher if role == "teacher" else self.micro_student

    @model_validator(mode="after")
    def _refine_engine(self) -> "ModelsConfig":
        if self.teacher_refine is not None and self.teacher_refine.engine == "vllm":
            raise ValueError("models.teacher_refine.engine: prepare's refinement samples with transformers "
                             "(allowed: auto, transformers; got 'vllm')")
        return self
