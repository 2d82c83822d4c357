"""Every metric key a trial emits, declared once with its producer.

A key is a literal (``loss``) or a family with placeholders
(``eval/<stage>/<countdown>/pass@<k>``). Readers validate names here instead of
keeping their own lists: the search objective and ASHA metric (`check_report_metric`,
called by `config.SearchConfig`), the plots (`require`), the Tune progress table
(`REPORTER_COLUMNS`) and the Ray gauges (`gauges`). tests/evals/test_keys.py runs
the real `evals.suite.Evaluator` on every domain and validates each key it emits.

Where a key appears (``Metric.scope``):

- ``step``: every distillation step's report (Ray Train, the ``metrics`` table at
  stage ``distill``, the final report): what ASHA can stop on;
- ``rlvr``: every RLVR step (the ``metrics`` table at stage ``rlvr`` and the Ray
  report of its 10-step windows);
- ``final``: a trial's final report only (evaluations, ``eval/forgetting``,
  ``time/train_s``);
- ``table``: the ``metrics`` table only (``resume/start_step``).

Adding a key is one line: ``register("kl/jsd", "recipe.loss.loss_step", "…")``.

The names the rest of the code spells the same way live here too: the Countdown variants
(`COUNTDOWN_VARIANTS`, their names `COUNTDOWN_TASKS`: a variant is one entry there; the task
registry of `config.tasks` and `tasks.base` builds each one's task from it), the prior skills
of the micro OOD suite (`SKILL_NAMES`), the
divergences and their estimators (`KINDS`, `ESTIMATORS`, `TOPK_SOURCES`, with the rule
`check_estimator` that the config, the ops and the chunked path all call), and
forgetting (`forgetting`, `with_forgetting`: the one definition of ``eval/forgetting``).
This module imports no other distillab module and no torch, so anything may read it
(`config`, `ops` and `analysis` included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Metric", "METRICS", "PLACEHOLDERS", "register", "unregister", "find", "require", "check_report_metric",
           "training_keys", "gauges", "REPORTER_COLUMNS", "FORGETTING_KEY", "FORGETTING_EVAL", "FORGETTING_STAGES",
           "forgetting", "with_forgetting", "eval_key", "SCOPES", "PAPER_POOL", "SMALL_POOL", "CountdownVariant",
           "COUNTDOWN_VARIANTS", "COUNTDOWN_TASKS", "SKILL_NAMES", "KINDS",
           "SAMPLED_KINDS", "ESTIMATORS", "ROLLOUT_ESTIMATORS", "TOPK_SOURCES", "K_GRADIENTS", "REDUCTIONS",
           "check_choice", "check_estimator", "ENV_SWITCHES"]

#: The paper's large operand pool for Countdown-3 and Countdown-4 (PROTOCOL.md §5).
PAPER_POOL: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75)
#: Countdown-4E operands: 1..10 (PROTOCOL.md §5).
SMALL_POOL: tuple[int, ...] = tuple(range(1, 11))


@dataclass(frozen=True)
class CountdownVariant:
    """One Countdown variant (PROTOCOL.md §5): its default operand ``pool`` (drawn with
    replacement), ``n_operands``, largest target, the offset of its test split's seed from
    ``tasks.test_seed`` (`config.SeedsConfig.test_split_seed`), what it is for (the config
    reference's line), its ``trial.domain`` value and its named SFT seed streams."""

    pool: tuple[int, ...]
    n_operands: int
    target_max: int
    test_split_offset: int
    doc: str
    #: the ``trial.domain`` value that distils on it (None: none)
    domain: str | None = None
    #: its named SFT seed streams beyond the demonstrations' own (``styled``: teacher-conditioned demonstrations)
    sft_streams: tuple[tuple[str, int], ...] = ()


#: The Countdown variants, each a task of its own (`config.TasksConfig` holds a `CountdownTaskConfig` per
#: entry, `tasks.countdown.CountdownTask` implements them): a new variant is one entry here.
COUNTDOWN_VARIANTS: dict[str, CountdownVariant] = {
    "countdown2": CountdownVariant(PAPER_POOL, 2, 1000, 7, "one-step Countdown: a prior skill of the micro student "
                                                           "(knows format and arithmetic, not the search)"),
    "countdown3": CountdownVariant(PAPER_POOL, 3, 1000, 0, "Countdown-3: the in-distribution task", "countdown",
                                   (("styled", 29),)),
    "countdown4e": CountdownVariant(SMALL_POOL, 4, 1000, 1, "Countdown-4E: four small operands, the generalisation task"),
    "countdown4": CountdownVariant(PAPER_POOL, 4, 10_000, 7, "Countdown-4: four operands from the paper's pool "
                                                             "(RLVR's task)"),
}
#: The Countdown variants a trial can score (the names of `COUNTDOWN_VARIANTS`; PROTOCOL.md §5).
COUNTDOWN_TASKS: tuple[str, ...] = tuple(COUNTDOWN_VARIANTS)
#: The prior skills of the micro OOD suite (`tasks.countdown.SKILLS` generates them; PROTOCOL.md §8).
SKILL_NAMES: tuple[str, ...] = ("add", "mul", "reverse", "sort")

#: Token-level divergences (PROTOCOL.md §2): forward KL(π_T‖π_S), reverse KL(π_S‖π_T), generalised JSD(β).
KINDS: tuple[str, ...] = ("forward", "reverse", "jsd")
#: The divergences the paper's single-sampled-token estimators exist for (PROTOCOL.md §2).
SAMPLED_KINDS: tuple[str, ...] = ("forward", "reverse")
#: Estimators of the divergence (`ops.kl.estimator_loss`): the full vocabulary (the oracle), the paper's
#: single sampled token, top-k over a support, and the k1/k2/k3 rollout-token estimators of the reverse KL.
ESTIMATORS: tuple[str, ...] = ("full", "sampled", "topk", "k1", "k2", "k3")
#: The k1/k2/k3 estimators (Schulman's), which estimate the reverse KL from the rollout's own tokens.
ROLLOUT_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
#: Whose top-k tokens form the support of the ``topk`` estimator.
TOPK_SOURCES: tuple[str, ...] = ("teacher", "student", "union")
#: The training gradient of k1/k2/k3: ``score`` (REINFORCE), ``pathwise`` (autograd of k), ``auto`` (score for k1,
#: pathwise for k2 and k3).
K_GRADIENTS: tuple[str, ...] = ("auto", "score", "pathwise")
#: How per-token losses reduce to the batch loss (`ops.kl.reduce_loss`).
REDUCTIONS: tuple[str, ...] = ("seq_mean", "token_mean", "sum")
#: Rollout policies ρ (PROTOCOL.md §1, §3): ``offpd`` the teacher samples, ``onpd`` the student samples,
#: ``spectrum`` π_λ between them (`rollout.spectrum`; λ = −1 the teacher, λ = 1 the student).
OFFPD, ONPD, SPECTRUM = "offpd", "onpd", "spectrum"
POLICIES: tuple[str, ...] = (OFFPD, ONPD, SPECTRUM)
__all__ += ["OFFPD", "ONPD", "SPECTRUM", "POLICIES"]
#: Environment switches distillab reads, with their allowed values (`driver.checks.env_errors` checks them
#: before anything starts). ``DISTILLAB_BF16_MATMULS``: `models.precision.bf16_matmuls_choice`.
ENV_SWITCHES: dict[str, tuple[str, ...]] = {"DISTILLAB_BF16_MATMULS": ("auto", "native", "float32")}


def check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise ValueError naming ``what``, the value and the allowed values unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed values: {', '.join(map(repr, allowed))}")


def check_estimator(estimator: str, kind: str, prefix: str = "") -> None:
    """The estimator/kind rule, in one place (`config.LossConfig`, `ops.kl.estimator_loss` and
    `ops.chunked.chunked_distill_loss` call it): ``estimator`` one of `ESTIMATORS`, ``kind`` one of
    `KINDS`; ``sampled`` exists for forward and reverse KL only (PROTOCOL.md §2); k1, k2 and k3 estimate
    the reverse KL, so they need ``kind`` reverse. ``prefix``: put before the field names in the
    message (the config's ``loss.``).

    Raises:
        ValueError: an unknown estimator or kind (names the allowed values), or a pair the rule excludes."""
    check_choice(f"{prefix}estimator", estimator, ESTIMATORS)
    check_choice(f"{prefix}kind", kind, KINDS)
    if estimator == "sampled" and kind not in SAMPLED_KINDS:
        raise ValueError(f"{prefix}estimator 'sampled' exists for {prefix}kind "
                         f"{' and '.join(map(repr, SAMPLED_KINDS))} only (got {kind!r})")
    if estimator in ROLLOUT_ESTIMATORS and kind != "reverse":
        raise ValueError(f"{prefix}estimator {estimator!r} estimates the reverse KL KL(π_S‖π_T) on the rollout "
                         f"token: set {prefix}kind 'reverse' (got {kind!r})")

SCOPES = ("step", "rlvr", "final", "table")

#: What each ``<placeholder>`` of a key family matches.
PLACEHOLDERS: dict[str, str] = {
    "stage": "pre|distill|rlvr",
    "countdown": "|".join(COUNTDOWN_TASKS),
    "skill": "|".join(SKILL_NAMES),
    "k": r"[1-9][0-9]*",
    "tau": r"[0-9][0-9.e+-]*",  # sparsity threshold τ as `f"{tau:g}"` writes it, e.g. 1e-06
    "tensor": r"[A-Za-z0-9_.]+",  # a parameter name, e.g. model.layers.0.mlp.up_proj.weight
    "lm_eval_task": r"[A-Za-z0-9_.-]+",  # an lm-eval-harness task name, e.g. truthfulqa_mc1
    "lm_eval_metric": r"[A-Za-z0-9_@.-]+",  # its metric without the filter, e.g. acc, pass@1
}


@dataclass(frozen=True)
class Metric:
    """One key (or key family) a trial emits.

    ``key``: the name, ``<placeholders>`` for families; ``producer``: the function
    that emits it; ``doc``: what it is, with units; ``scope``: where it appears
    (module docstring); ``gauge``: the Ray gauge (Prometheus) name it is exported as,
    if any."""

    key: str
    producer: str
    doc: str
    scope: str = "step"
    gauge: str | None = None

    @property
    def pattern(self) -> re.Pattern:
        """The compiled full-match pattern of ``key``."""
        parts = re.split(r"<([a-z_]+)>", self.key)
        out = "".join(f"(?:{PLACEHOLDERS[p]})" if i % 2 else re.escape(p) for i, p in enumerate(parts))
        return re.compile(out)


METRICS: dict[str, Metric] = {}


def register(key: str, producer: str, doc: str, *, scope: str = "step", gauge: str | None = None) -> Metric:
    """Declare a key (or family). Returns the `Metric`.

    Raises:
        ValueError: a key registered twice, an unknown scope or placeholder."""
    if key in METRICS:
        raise ValueError(f"metric {key!r} is registered twice")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    unknown = [p for p in re.findall(r"<([a-z_]+)>", key) if p not in PLACEHOLDERS]
    if unknown:
        raise ValueError(f"metric {key!r}: unknown placeholder(s) {unknown}; allowed: {list(PLACEHOLDERS)}")
    METRICS[key] = Metric(key, producer, doc, scope, gauge)
    return METRICS[key]


# --------------------------------------------------------------------------------------------- distillation
_LOSS = "recipe.loss.loss_step"
register("step", "recipe.distill.log_step", "optimizer steps done (Tune's time axis; the RLVR stage continues it)")
register("loss", "recipe.distill.step_metrics", "the distillation loss of the step (nats, loss.reduction)",
         gauge="distillab_loss")
register("grad_norm", "recipe.optim.optimizer_step", "global gradient norm before clipping")
register("lr", "recipe.optim.optimizer_step", "learning rate of the step")
register("kl/forward", _LOSS, "mean KL(π_T‖π_S) over the step's completion tokens (nats, loss τ)",
         gauge="distillab_kl_forward")
register("kl/reverse", _LOSS, "mean KL(π_S‖π_T) over the step's completion tokens (nats, loss τ)",
         gauge="distillab_kl_reverse")
register("teacher/entropy", _LOSS, "mean H(π_T) over completion tokens (nats)")
register("teacher/cross_entropy", _LOSS, "mean H(π_T, π_S) over completion tokens (nats)")
register("is/weight_mean", _LOSS, "mean truncated importance weight w(y) (loss.importance_weight; "
         "rollout.staleness_correction tis)")
# the oracle (every loss.oracle_every steps): the estimator against the exact full-vocabulary divergence (ops.oracle)
_ORACLE = "recipe.loss.oracle"
register("estimator/bias", _ORACLE, "estimator's estimate − exact value of the reduced divergence it estimates (nats)")
register("estimator/grad_cos", _ORACLE, "cosine between the estimator's and the exact gradient w.r.t. the student logits")
register("estimator/grad_norm_ratio", _ORACLE, "‖estimator gradient‖ / ‖exact gradient‖ (w.r.t. the student logits)")
register("estimator/grad_cos_forward", _ORACLE, "cosine between the estimator's gradient and the exact KL(π_T‖π_S)'s")
register("estimator/grad_cos_reverse", _ORACLE, "cosine between the estimator's gradient and the exact KL(π_S‖π_T)'s")
# the shared teacher (teacher.serve: shared; distillab.recipe.teacher): what each step's request cost
register("teacher/bytes_per_token", "recipe.teacher.SharedTeacher.score",
         "bytes of the teacher service's answer per scored token (teacher.payload; payload.payload_bytes_per_token)")
register("teacher/request_ms", "recipe.teacher.SharedTeacher.score",
         "wall milliseconds of the step's request to the teacher service (teacher.serve shared)")
register("rollout/length", "recipe.distill.step_metrics", "mean completion length (tokens)")
register("rollout/staleness", "recipe.distill.step_metrics",
         "update lag of the weights that sampled the step's rollouts (steps; ≤ rollout.max_staleness; "
         "rollout.stale.StaleRollouts)")
register("rollout/tokens_per_s", "recipe.distill.step_metrics", "completion tokens sampled per second (fresh rollouts)",
         gauge="distillab_rollout_tokens_per_s")
register("rollout/student_loglik", "rollout.spectrum.SpectrumEngine", "mean per-token log π_S of the λ-spectrum rollouts")
register("rollout/teacher_loglik", "rollout.spectrum.SpectrumEngine", "mean per-token log π_T of the λ-spectrum rollouts")
register("time/step_s", "recipe.distill.step_metrics", "wall seconds of the step")
register("time/rollout_s", "recipe.distill.step_metrics", "wall seconds spent getting the step's rollouts")
register("time/sync_s", "recipe.distill.step_metrics", "wall seconds of the OnPD weight sync into the vLLM engine")
register("time/train_s", "recipe.distill.end_loop", "wall seconds of the distillation loop (this run)", scope="final")
register("resume/start_step", "recipe.distill.setup_trial", "the step a restarted worker group resumed at", scope="table")
# where a trial's fixed cost goes (telemetry.TrialTimes; benchmarks/sweep_overhead.py prints them)
for _name, _doc in (
    ("trainable_import", "Tune trial actor: its process start to the trainable's first line (imports, unpickling)"),
    ("worker_launch", "the trainable's first line to the Train worker's process start (controller, placement group)"),
    ("worker_init", "the Train worker's process start to the train function's first line (imports, process group); "
                    "with resources.local_mode, the trainable's first line to the recipe's (no worker to launch)"),
    ("setup", "the train function's first line to the first step (models, evaluation before training, DeepSpeed)"),
    ("eval_distill", "the evaluation after distillation (rank 0)"),
    ("finish", "the last step to the final report (evaluations, RLVR stage, final checkpoint written)"),
):
    register(f"time/{_name}_s", "recipe.telemetry.TrialTimes", f"wall seconds: {_doc}", scope="table")

# --------------------------------------------------------------------------------------------- RLVR
for _name, _doc in (
    ("reward_mean", "mean reward of the step's samples, all ranks"),
    ("accuracy", "share of correct samples, all ranks"),
    ("loss", "DAPO loss (token-level, all ranks)"),
    ("clip_frac", "share of tokens whose ratio was clipped"),
    ("ratio_mean", "mean importance ratio π_θ/π_old (1 with one step per batch)"),
    ("kl", "k3 reference KL (0 when rlvr.beta = 0)"),
    ("grad_norm", "global gradient norm before clipping"),
    ("lr", "learning rate of the step"),
    ("sampler_logp_gap", "mean log π_old − sampler logprob over completion tokens (0 when synced)"),
):
    register(f"rlvr/{_name}", "recipe.rlvr.run_rlvr", _doc, scope="rlvr",
             gauge="distillab_reward_mean" if _name == "reward_mean" else None)

# --------------------------------------------------------------------------------------------- evaluations
_SUITE, _OOD = "evals.suite.Evaluator", "evals.ood"
for _key, _producer, _doc in (
    ("eval/<stage>/<countdown>/accuracy", _SUITE, "one sample per test item at evaluation.id_temperature"),
    ("eval/<stage>/<countdown>/pass@<k>", _SUITE, "unbiased pass@k from evaluation.pass_n samples"),
    ("eval/<stage>/<countdown>/style_share", _SUITE, "share of answers in the teacher's style (evaluation.style)"),
    ("eval/<stage>/mcq/accuracy", _SUITE, "multiple-choice accuracy (evaluation.mcq_items)"),
    ("eval/<stage>/mcq/pass@<k>", _SUITE, "multiple-choice pass@k"),
    ("eval/<stage>/math/accuracy", _SUITE, "math accuracy: the last \\boxed{} equals the answer (evaluation.math_items)"),
    ("eval/<stage>/math/pass@<k>", _SUITE, "math pass@k"),
    ("eval/<stage>/ood/prose/loss", "evals.prose.prose_rows",
     "per-token negative log-likelihood of held-out prose, nats/token (ood_backend pretrained; not in ood_mean)"),
    ("eval/<stage>/ood/prose/next_token_accuracy", "evals.prose.prose_rows",
     "share of held-out prose tokens that are the model's argmax next token (ood_backend pretrained)"),
    ("eval/<stage>/ood/<skill>/accuracy", _OOD + ".MicroSkillsBackend", "exact match on a prior skill"),
    ("eval/<stage>/ood/<lm_eval_task>/<lm_eval_metric>", _OOD + ".LMEvalBackend",
     "an lm-eval task's standard metric, scaled to [0, 1]"),
    ("eval/<stage>/ood/ood_mean", _OOD, "unweighted mean of the OOD tasks' scores in [0, 1] (not the prose loss)"),
    ("eval/<stage>/params/sparsity@<tau>", "evals.suite.evaluate_stage",
     "update sparsity S_τ over all parameters (τ: the threshold; 1 at pre)"),
    ("eval/<stage>/params/<tensor>/sparsity@<tau>", "evals.suite.evaluate_stage", "update sparsity S_τ of one tensor"),
    ("eval/<stage>/params/sparsity_touched@<tau>", "evals.suite.sparsity_rows",
     "S_τ over only the parameter entries that had a nonzero gradient in some distillation step (stage distill)"),
    ("eval/<stage>/params/touched_share", "evals.suite.sparsity_rows",
     "share of parameter entries that had a nonzero gradient in some distillation step (stage distill)"),
):
    register(_key, _producer, _doc, scope="final")

#: Forgetting (PROTOCOL.md §4): `forgetting` of the OOD mean before and after distillation.
FORGETTING_KEY = "eval/forgetting"
register(FORGETTING_KEY, "registry.with_forgetting", "OOD mean after distillation − before (negative = forgotten)",
         scope="final")
#: Forgetting's inputs (PROTOCOL.md §4): the ``(task, metric)`` eval compared, and the stages before and after.
FORGETTING_EVAL = ("ood", "ood_mean")
FORGETTING_STAGES = ("pre", "distill")


def forgetting(before, after):
    """Forgetting ΔOOD = OOD mean after distillation − before (PROTOCOL.md §4):
    negative = forgotten. ``before``/``after``: the ``ood_mean`` evals (`FORGETTING_EVAL`)
    at the stages `FORGETTING_STAGES`, each in [0, 1] (floats, or Polars expressions:
    `analysis.results.forgetting` applies it to columns). The one definition: the final
    report (`with_forgetting`) and `analysis.results.forgetting` use it."""
    return after - before


def unregister(key: str) -> None:
    """Remove a key `register` declared (a test's own task's keys, at its end)."""
    METRICS.pop(key, None)


def eval_key(stage: str, task: str, metric: str) -> str:
    """``eval/<stage>/<task>/<metric>``: the report key of an evaluation row."""
    return f"eval/{stage}/{task}/{metric}"


def find(name: str) -> Metric | None:
    """The registered `Metric` whose key or family matches ``name``, or None."""
    if name in METRICS:
        return METRICS[name]
    return next((m for m in METRICS.values() if "<" in m.key and m.pattern.fullmatch(name)), None)


def require(name: str) -> str:
    """``name`` if it is a registered key (plots and tables use this for the names they read).

    Raises:
        KeyError: an unregistered name."""
    if find(name) is None:
        raise KeyError(f"metric {name!r} is not in distillab.registry")
    return name


def training_keys() -> list[str]:
    """The literal keys of every distillation step's report (what ASHA can stop on)."""
    return [k for k, m in METRICS.items() if m.scope == "step" and "<" not in k]


def check_report_metric(name: str, field: str, *, training_only: bool = False) -> None:
    """Raise ValueError naming ``field`` if ``name`` is not a key trials report to Ray Tune
    (``training_only``: a key of every distillation step's report, for ASHA).

    Raises:
        ValueError: an unknown key, with the allowed forms.
    """
    m = find(name)
    allowed_scopes = ("step",) if training_only else ("step", "rlvr", "final")
    if m is not None and m.scope in allowed_scopes:
        return
    allowed = f"one of {training_keys()}"
    if not training_only:
        families = [k for k, mm in METRICS.items() if mm.scope in ("rlvr", "final")]
        allowed += f", or one of {families} (e.g. eval/distill/countdown3/accuracy, eval/distill/mcq/accuracy)"
    raise ValueError(f"{field} {name!r} is not a reported metric; allowed: {allowed}")


def gauges() -> dict[str, str]:
    """``{key: gauge name}`` of the keys exported as Ray gauges."""
    return {k: m.gauge for k, m in METRICS.items() if m.gauge}


#: Metric columns of the Tune progress table (report key → column title).
REPORTER_COLUMNS: dict[str, str] = {
    require(k): title for k, title in (
        ("step", "step"), ("loss", "loss"), ("kl/forward", "fKL"), ("kl/reverse", "rKL"),
        ("rollout/tokens_per_s", "tok/s"), ("eval/distill/countdown3/accuracy", "acc"), (FORGETTING_KEY, "dOOD"),
    )
}


def with_forgetting(report: dict[str, float]) -> dict[str, float]:
    """``report`` (``eval/<stage>/<task>/<metric>`` keys) plus ``eval/forgetting``
    (`forgetting` of the OOD means before and after) when both are there."""
    (task, metric), (before, after) = FORGETTING_EVAL, FORGETTING_STAGES
    pre, post = report.get(eval_key(before, task, metric)), report.get(eval_key(after, task, metric))
    if pre is None or post is None:
        return dict(report)
    return {**report, FORGETTING_KEY: forgetting(pre, post)}


# --------------------------------------------------------------------------------------------- study axes
# What a sweep varies, declared once: the config keys a grid or an Optuna space may sweep (`SEARCHABLE`),
# how each prints, whether its values split a report row, and its part of the trial name. Read by the
# config (`config.SearchConfig`, `config.TrialConfig.trial_id`), the report and the plots
# (`analysis.results.group_columns`), `distillab findings --by` and the dry-run's trial lines.
__all__ += ["Axis", "AXES", "SEARCHABLE", "axis", "value_text", "trial_name", "estimator_label", "teacher_label"]


def value_text(v: Any) -> str:
    """How an axis value prints unless its `Axis` says otherwise: "–" for null, ``%g`` for a float."""
    if v is None:
        return "–"
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Axis:
    """One searchable study axis.

    ``key``: the dotted path into `config.TrialConfig` (YAML names: ``rollout.lambda``), which is also
    its column in the ``trials`` table; ``short``: its short name in labels and the dry-run's trial
    lines; ``fmt``: how a value prints; ``bare``: a label shows the value alone (its values say which
    axis: ``offpd``, ``forward``); ``groups``: whether its values split a report row (the seed does not:
    a row is a mean over seeds); ``name``: its part of the trial name, from the trial's values by
    dotted key (``""``: none), placed by ``name_at`` (ascending), left out while the value is the
    trial default unless ``name_if_default``; ``shown_by``: the axis whose name part shows this one's
    value (λ in ``spectrum-2``)."""

    key: str
    short: str
    fmt: Callable[[Any], str] = value_text
    bare: bool = False
    groups: bool = True
    name: Callable[[Mapping[str, Any]], str] | None = None
    name_at: int = 0
    name_if_default: bool = True
    shown_by: str | None = None

    def text(self, value: Any) -> str:
        """The value as a label prints it: ``λ=0.5``, ``lr=0.0003``, ``offpd`` (``bare``); "–" for null."""
        if value is None:
            return "–"
        return self.fmt(value) if self.bare else f"{self.short}={self.fmt(value)}"

    @property
    def in_name(self) -> bool:
        """Whether the trial name shows the value (its own part, or ``shown_by``'s)."""
        return self.name is not None or self.shown_by is not None


AXES: dict[str, Axis] = {}
#: The keys a grid (``search.grid``, ``search.grids[].grid``) or an Optuna space may sweep: `AXES`'s
#: keys (a live view: an axis registered later is searchable at once).
SEARCHABLE = AXES.keys()


def axis(key: str, short: str, **kw: Any) -> Axis:
    """Register the study axis ``key`` (`Axis` fields as keywords). Returns it.

    Raises:
        ValueError: ``key`` registered twice."""
    if key in AXES:
        raise ValueError(f"axis {key!r} is registered twice")
    AXES[key] = Axis(key, short, **kw)
    return AXES[key]


def estimator_label(estimator: str, top_k: int, topk_source: str, topk_tail: bool, k_gradient: str) -> str:
    """The estimator in a trial name: "" for ``full``, else e.g. ``sampled``, ``topk8-teacher``,
    ``topk8-union-tail``, ``k3``, ``k1-pathwise`` (``k_gradient`` named unless ``auto``)."""
    if estimator == "full":
        return ""
    if estimator == "topk":
        return f"topk{top_k}-{topk_source}" + ("-tail" if topk_tail else "")
    if estimator == "sampled":
        return "sampled"
    return estimator + ("" if k_gradient == "auto" else f"-{k_gradient}")


def teacher_label(serve: str, payload: str | None, top_k: int | None) -> str:
    """The teacher in a trial name: "" in the worker, ``hidden`` or ``topk<k>`` when shared."""
    if serve == "worker":
        return ""
    return "hidden" if payload == "hidden" else f"topk{top_k}"


def trial_name(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """The readable part of a trial id: the name parts of `AXES` in ``name_at`` order, joined by ``-``
    (empty parts, and the parts of axes at their ``defaults`` value that are not ``name_if_default``,
    left out). ``values``, ``defaults``: a trial's and the default trial's values by dotted key
    (`config.TrialConfig.flat`). E.g. ``onpd-forward-stale4-lr0.0003-s42``."""
    parts = []
    for a in sorted((a for a in AXES.values() if a.name is not None), key=lambda a: a.name_at):
        if a.name_if_default or values[a.key] != defaults[a.key]:
            parts.append(a.name(values))
    return "-".join(p for p in parts if p)


def _loss_label(v: Mapping[str, Any]) -> str:
    return estimator_label(*(v[f"loss.{k}"] for k in ("estimator", "top_k", "topk_source", "topk_tail", "k_gradient")))


axis("seed", "seed", groups=False, name=lambda v: f"s{v['seed']}", name_at=90)
axis("domain", "domain")
axis("precision", "precision")
axis("master_weights", "master")
axis("rollout.policy", "policy", bare=True, name_at=10,
     name=lambda v: f"{SPECTRUM}{v['rollout.lambda']:g}" if v["rollout.policy"] == SPECTRUM else v["rollout.policy"])
axis("rollout.lambda", "λ", shown_by="rollout.policy")
axis("rollout.alpha", "α")
axis("rollout.clip_c", "clip_c")
axis("rollout.tau_t", "sample τ_T")
axis("rollout.tau_s", "sample τ_S")
axis("rollout.top_p", "top_p")
axis("rollout.max_tokens", "max_tokens")
axis("rollout.engine", "engine")
axis("rollout.sync_every", "sync_every")
axis("rollout.offpd_reuse", "offpd_reuse")
axis("rollout.max_staleness", "staleness", name=lambda v: f"stale{v['rollout.max_staleness']}", name_at=50,
     name_if_default=False)
axis("rollout.staleness_correction", "correction", name=lambda v: v["rollout.staleness_correction"], name_at=51,
     name_if_default=False)
axis("rollout.tis_cap", "tis_cap")
axis("loss.kind", "KL", bare=True, name_at=20,
     name=lambda v: f"jsd{v['loss.beta']:g}" if v["loss.kind"] == "jsd" else v["loss.kind"])
axis("loss.beta", "β", shown_by="loss.kind")
axis("loss.importance_weight", "importance_weight")
axis("loss.estimator", "estimator", name=_loss_label, name_at=30)
axis("loss.tau_t", "loss τ_T")
axis("loss.tau_s", "loss τ_S")
axis("loss.reduction", "reduction")
for _k in ("top_k", "topk_source", "topk_tail", "k_gradient"):
    axis(f"loss.{_k}", _k, shown_by="loss.estimator")
axis("teacher.serve", "serve", name_at=40,
     name=lambda v: teacher_label(v["teacher.serve"], v["teacher.payload"], v["teacher.top_k"]))
axis("teacher.payload", "payload", shown_by="teacher.serve")
axis("teacher.top_k", "payload_k", shown_by="teacher.serve")
axis("optimizer.lr", "lr", name=lambda v: f"lr{v['optimizer.lr']:g}", name_at=80)
axis("optimizer.clip", "clip")
axis("optimizer.steps", "steps")
axis("optimizer.warmup_steps", "warmup")
axis("optimizer.zero_stage", "zero")
axis("optimizer.weight_decay", "wd")
axis("optimizer.prompts_per_step", "prompts")
axis("optimizer.rollouts_per_prompt", "rollouts")
