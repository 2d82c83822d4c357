"""The loss stage of a distillation step (PROTOCOL.md §2): one forward path, then an
implementation from a table, then (on a schedule) the oracle.

    rollouts ─▶ `pack_batch` (student and teacher views of the same completions, one width)
             ─▶ `forward`: final hidden states of student (with grad) and teacher, lm_head weights
                (``teacher.serve: shared``: the teacher's from the sweep's service, `distillab.recipe.teacher`;
                with ``teacher.payload: topk``, the teacher's rebuilt logits instead)
             ─▶ LOSSES[`loss_impl`(loss)]: `LossOutput` (loss, per-token statistics (N, 4), estimate)
             ─▶ `importance_weights` (optional) and `diagnostics`, built once from those
             ─▶ every ``loss.oracle_every`` steps, `oracle`: the estimator's bias and gradient
                cosine against the exact full-vocabulary divergence on the same batch

Implementations (``LOSSES``; each ``f(fwd, loss_cfg, weights, generator) -> LossOutput``),
each running the configured ``loss.estimator`` (`ops.kl` module docstring):

- ``reference``: materialises the (B, T, V) logits and calls ``ops.kl.estimator_loss``
  (the float64-safe ground truth; memory O(tokens × vocab));
- ``chunked`` / ``triton``: ``ops.chunked.chunked_distill_loss`` fused with the lm_head
  over row chunks (never more than chunk × vocab logits; ``triton`` requires the kernels,
  estimator ``full`` only);
- ``sampled``: the single-token estimators, on the logits (``ops.kl.estimator_loss``).

A new estimator is one branch of ``ops.kl.estimator_loss`` (and its rows in
``ops.chunked.estimator_rows``), its name in `registry.ESTIMATORS` (the `config.LossConfig`
``Literal`` reads it; the kinds it estimates in `registry.check_estimator`) and `loss_impl`'s
rule; a new config field of it reaches the ops under its own name through `divergence_kwargs`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import NamedTuple

import torch
import torch.nn.functional as F

from distillab.config import LossConfig, TrialConfig
from distillab.ops.chunked import chunked_distill_loss, estimator_rows, pad_vocab, token_logprobs_from_hidden
from distillab.ops.kl import STAT_NAMES, engine_mismatch_weights, estimator_loss, row_coefficients, token_stats
from distillab.ops.oracle import chunked_oracle, logits_oracle
from distillab.registry import OFFPD
from distillab.rollout.types import Rollouts, engine_logprobs, model_device, pack_rollouts, position_ids

__all__ = ["Batch", "Forward", "LossOutput", "LOSSES", "DIAGNOSTICS", "pack_batch", "forward", "loss_impl",
           "oracle_due", "oracle", "importance_weights", "diagnostics", "loss_step"]

#: diagnostics key of each column of the per-token statistics (``ops.kl.STAT_NAMES``)
DIAGNOSTICS = dict(zip(STAT_NAMES, ("kl/forward", "kl/reverse", "teacher/entropy", "teacher/cross_entropy")))


@dataclass
class Batch:
    """Packed rollouts: the student's and the teacher's model inputs (``input_ids``,
    ``attention_mask``, ``position_ids``; (B, T) each, one width), the completion mask
    ``cmask`` (B, T) bool shared by both, and ``targets`` (B, T), the token each
    position's logits predict."""

    inputs: dict
    teacher_inputs: dict
    cmask: torch.Tensor
    targets: torch.Tensor


def pack_batch(rollouts: Rollouts, pad_id: int, device: torch.device | str | None = None) -> Batch:
    """`Batch` of ``rollouts`` on ``device`` (default CPU; `loss_step` passes the student's).
    With teacher conditioning (``rollouts.teacher_prompt_ids``) the teacher sees its own
    prompts before the same completions; both packs are left-padded to one width, so the
    completion positions (and ``cmask``) coincide."""
    t_prompts = rollouts.teacher_prompt_ids
    width = None
    if t_prompts is not None:  # teacher conditioning: one width, so both packs have the same completion mask
        width = max(len(p) + len(c) for ps in (rollouts.prompt_ids, t_prompts)
                    for p, c in zip(ps, rollouts.completion_ids))
    ids, attn, cmask = pack_rollouts(rollouts.prompt_ids, rollouts.completion_ids, pad_id, width=width,
                                     device=device)  # (B, T)
    inputs = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
    t_inputs = inputs
    if t_prompts is not None:
        t_ids, t_attn, t_cmask = pack_rollouts(t_prompts, rollouts.completion_ids, pad_id, width=width, device=device)
        if not torch.equal(t_cmask, cmask):
            raise AssertionError("teacher and student completion masks differ")  # pack_rollouts right-aligns
        t_inputs = dict(input_ids=t_ids, attention_mask=t_attn, position_ids=position_ids(t_attn))
    return Batch(inputs, t_inputs, cmask, torch.roll(ids, shifts=-1, dims=1))


@dataclass
class Forward:
    """Both models' final hidden states on a `Batch` (``h_s`` (B, T, H_S) with gradient,
    ``h_t`` (B, T, H_T) without) and their lm_heads (``w`` (V, H), ``b`` (V,) or None;
    padded to one V with ``loss.pad_vocab``). With ``teacher.payload: topk`` the teacher is
    ``t_logits`` (B, T, V) float32, the logits of the distribution rebuilt from the payload
    (`teacher.topk_logits`), and ``h_t`` is None except on an oracle step (the exact teacher)."""

    batch: Batch
    h_s: torch.Tensor
    h_t: torch.Tensor | None
    w_s: torch.Tensor
    b_s: torch.Tensor | None
    w_t: torch.Tensor
    b_t: torch.Tensor | None
    t_logits: torch.Tensor | None = None
    teacher_metrics: dict[str, float] = field(default_factory=dict)  # a shared teacher's request (`teacher`)

    def logits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Full (B, T, V) student and teacher logits (the lm_head applied as the models do;
        the rebuilt ``t_logits`` of a ``topk`` payload)."""
        t = F.linear(self.h_t, self.w_t, self.b_t) if self.t_logits is None else self.t_logits
        return F.linear(self.h_s, self.w_s, self.b_s), t


@lru_cache(maxsize=None)
def _keeps_last_logits(forward_type: type) -> bool:
    """Whether a model class's forward takes ``logits_to_keep`` (cached per class: signature() is slow)."""
    return "logits_to_keep" in inspect.signature(forward_type.forward).parameters


def _hidden(model, module, inputs: dict) -> torch.Tensor:
    """Final hidden states (after the final norm for Llama/Qwen), computing the
    logits of the last position only where the model allows (``logits_to_keep=1``)."""
    keep = _keeps_last_logits(type(module))
    return model(**inputs, output_hidden_states=True, **({"logits_to_keep": 1} if keep else {})).hidden_states[-1]


def _lm_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def _pad_teacher_logits(t_logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Rebuilt teacher logits (B, T, V_T) padded with −inf columns to ``vocab`` (``loss.pad_vocab``)."""
    pad = t_logits.new_full((*t_logits.shape[:-1], vocab - t_logits.shape[-1]), float("-inf"))
    return torch.cat([t_logits, pad], dim=-1)


def forward(engine, teacher, batch: Batch, pad: bool, trial: TrialConfig | None = None,
            oracle_step: bool = False) -> Forward:
    """Teacher (no grad) and student (``engine(...)``: DeepSpeed's hooks run) forward on
    ``batch``; ``pad``: pad the smaller lm_head with −inf rows (``ops.chunked.pad_vocab``).
    ``teacher``: a `teacher.LocalTeacher` (``teacher.serve: worker``) or a `teacher.SharedTeacher`,
    asked for ``trial``'s payload (and, at an ``oracle_step`` of a ``topk`` payload, the hidden states too)."""
    answer = teacher.score(trial, batch.teacher_inputs, with_hidden=oracle_step)
    h_t, t_logits, metrics = answer.h_t, answer.t_logits, answer.metrics  # (B, T, H_T) or None, (B, T, V_T) or None
    h_s = _hidden(engine, engine.module, batch.inputs)  # (B, T, H_S)
    (w_s, b_s), (w_t, b_t) = _lm_head(engine.module), (teacher.w_t, teacher.b_t)  # (V_S, H_S), (V_T, H_T)
    w_t, b_t = w_t.detach(), None if b_t is None else b_t.detach()  # a constant: h_t never enters autograd
    if pad and w_s.shape[0] < w_t.shape[0]:
        w_s, b_s = pad_vocab(w_s, w_t.shape[0], b_s)
    elif pad and w_t.shape[0] < w_s.shape[0]:
        w_t, b_t = pad_vocab(w_t, w_s.shape[0], b_t)
        t_logits = None if t_logits is None else _pad_teacher_logits(t_logits, w_s.shape[0])
    return Forward(batch, h_s, h_t, w_s, b_s, w_t, b_t, t_logits, metrics)


class LossOutput(NamedTuple):
    """What a `LOSSES` implementation returns: the training ``loss`` (0-dim, nats, with the
    estimator's gradient), ``stats`` (N, 4) the full-vocabulary ``ops.kl.STAT_NAMES`` of
    the N completion tokens, the estimator's ``estimate`` of the divergence (0-dim,
    detached; `ops.kl.EstimatorLoss`) and, on the logits path, the (B, T, V) ``logits``
    (student, teacher) the loss was computed from (None on the chunked path)."""

    loss: torch.Tensor
    stats: torch.Tensor
    estimate: torch.Tensor
    logits: tuple[torch.Tensor, torch.Tensor] | None = None


#: The `config.LossConfig` fields the divergence ops read, by the same names from the YAML to the kernels:
#: the divergence (`ops.kl.token_divergence`, `ops.oracle`) and how it is estimated (`ops.kl.estimator_loss`,
#: `ops.chunked.estimator_rows`); `ops.chunked.chunked_distill_loss` reads both.
DIVERGENCE_FIELDS = ("kind", "tau_s", "tau_t", "beta")
ESTIMATOR_FIELDS = ("estimator", "top_k", "topk_source", "topk_tail", "k_gradient")


def divergence_kwargs(L: LossConfig, *, divergence: bool = True, estimator: bool = True) -> dict:
    """The divergence ops' keyword arguments from the loss config ``L``: the one adapter between
    the config and `distillab.ops` (no renaming: each op's parameter is the field's name).
    ``divergence``: the `DIVERGENCE_FIELDS`; ``estimator``: the `ESTIMATOR_FIELDS`."""
    fields = (DIVERGENCE_FIELDS if divergence else ()) + (ESTIMATOR_FIELDS if estimator else ())
    return {f: getattr(L, f) for f in fields}


def _logits_path(fwd: Forward, L: LossConfig, weights, gen) -> LossOutput:
    s_logits, t_logits = fwd.logits()  # (B, T, V)
    b = fwd.batch
    out = estimator_loss(s_logits, t_logits, b.cmask, targets=b.targets, generator=gen, reduction=L.reduction,
                         weights=weights, **divergence_kwargs(L))
    stats = token_stats(s_logits[b.cmask], t_logits[b.cmask], tau_s=L.tau_s, tau_t=L.tau_t)
    return LossOutput(out.loss, stats, out.estimate, (s_logits, t_logits))


def _chunked(fwd: Forward, L: LossConfig, weights, gen, *, backend: str) -> LossOutput:
    loss, stats = chunked_distill_loss(
        fwd.h_s, fwd.w_s, fwd.h_t, fwd.w_t, fwd.batch.cmask, student_bias=fwd.b_s, teacher_bias=fwd.b_t,
        reduction=L.reduction, weights=weights, backend=backend, return_stats=True, targets=fwd.batch.targets,
        **divergence_kwargs(L),
    )
    return LossOutput(loss, stats, loss.detach())


#: implementation name → ``f(fwd, loss_cfg, weights, generator) -> LossOutput``
LOSSES = {
    "reference": _logits_path,
    "chunked": partial(_chunked, backend="auto"),
    "triton": partial(_chunked, backend="triton"),
    "sampled": _logits_path,
}


def loss_impl(L: LossConfig) -> str:
    """The `LOSSES` entry of a loss config: ``sampled`` for the sampled estimator (its
    draws need the whole distributions, so it materialises the logits), else ``loss.impl``
    (``chunked`` and ``reference`` run every other estimator; ``triton`` is ``full`` only)."""
    return "sampled" if L.estimator == "sampled" else L.impl


def oracle_due(L: LossConfig, step: int | None) -> bool:
    """True when optimizer step ``step`` (1-based) runs the oracle: every ``loss.oracle_every`` steps."""
    return bool(L.oracle_every) and step is not None and step % L.oracle_every == 0


def oracle(fwd: Forward, L: LossConfig, weights: torch.Tensor | None, out: LossOutput) -> dict[str, float]:
    """The full-vocabulary oracle of the step's estimator on the same batch (`ops.oracle`):
    ``estimator/<name>`` for ``ops.oracle.ORACLE_METRICS`` ({} without completion tokens,
    or without a gradient to measure). Reuses the step's hidden states or logits (no model
    forward) and leaves the loss and its gradient untouched: on the logits path the
    estimator's gradient is ``torch.autograd.grad`` w.r.t. the logits (graph retained, no
    ``.grad`` written), on the chunked path the same row math recomputed without autograd.
    With ``teacher.payload: topk`` the exact divergence is the one against the true teacher (the
    hidden states the service sends at an oracle step, under the trial's lm_head), so
    ``estimator/bias`` is what the truncated payload (and the estimator) costs."""
    b = fwd.batch
    if not b.cmask.any() or not out.loss.requires_grad:
        return {}
    B = b.cmask.shape[0]
    seq = torch.arange(B, device=b.cmask.device).unsqueeze(1).expand_as(b.cmask)[b.cmask]  # (N,)
    coef = row_coefficients(seq, B, reduction=L.reduction, weights=weights)  # (N,) float64
    kw = divergence_kwargs(L, estimator=False)
    if out.logits is not None:
        s_logits, t_logits = out.logits
        (g,) = torch.autograd.grad(out.loss, s_logits, retain_graph=True)  # (B, T, V) ∂loss/∂z_S
        exact = t_logits.detach()[b.cmask] if fwd.t_logits is None else F.linear(fwd.h_t[b.cmask], fwd.w_t, fwd.b_t)
        metrics = logits_oracle(s_logits.detach()[b.cmask], exact, g[b.cmask], coef, estimate=float(out.estimate),
                                **kw)
    else:
        est = estimator_rows(targets=b.targets[b.cmask], **divergence_kwargs(L, divergence=False))
        metrics = chunked_oracle(fwd.h_s.detach()[b.cmask], fwd.w_s.detach(),
                                 None if fwd.b_s is None else fwd.b_s.detach(), fwd.h_t[b.cmask], fwd.w_t, fwd.b_t,
                                 coef, est=est, **kw)
    return {f"estimator/{k}": v for k, v in metrics.items()}


def importance_weights(trial: TrialConfig, rollouts: Rollouts, cmask: torch.Tensor,
                       policy_logp: torch.Tensor) -> torch.Tensor:
    """Truncated importance weights w(y) = mean_t min(c, exp(log p_θ − log q)) (PROTOCOL.md
    §2; ``ops.kl.engine_mismatch_weights``; detached): ``policy_logp`` (B, T) is the
    trainer's log p_θ of each sampled token under the rollout policy at its sampling τ,
    q the behaviour logprobs carried by ``rollouts`` (the engine's, of weights up to
    ``rollout.max_staleness`` updates old). One weight corrects both the engine mismatch
    (``loss.importance_weight``) and staleness (``rollout.staleness_correction: tis``);
    its cap c is 2 (§2), or ``rollout.tis_cap`` with ``tis``. Returns (B,) float32."""
    r = trial.rollout
    cap = r.tis_cap if r.staleness_correction == "tis" else 2.0
    return engine_mismatch_weights(policy_logp, engine_logprobs(rollouts, cmask), cmask, clip=cap)


def _policy_logp(trial: TrialConfig, fwd: Forward) -> torch.Tensor:
    """log p_θ (B, T) of each sampled token under the rollout policy at its sampling τ
    (the teacher at τ_T for OffPD, the student at τ_S for OnPD), 0 off the completions."""
    r, b = trial.rollout, fwd.batch
    h, w, bias, tau = (fwd.h_t, fwd.w_t, fwd.b_t, r.tau_t) if r.policy == OFFPD else (
        fwd.h_s.detach(), fwd.w_s.detach(), fwd.b_s, r.tau_s)
    logp = torch.zeros(b.cmask.shape, dtype=torch.float32, device=b.cmask.device)
    logp[b.cmask] = token_logprobs_from_hidden(h[b.cmask], w, b.targets[b.cmask], tau,
                                               bias=None if bias is None else bias.detach())
    return logp


def diagnostics(stats: torch.Tensor, weights: torch.Tensor | None) -> dict[str, float]:
    """Token means of the (N, 4) statistics (0 for a batch without completion tokens)
    under the `DIAGNOSTICS` keys, and ``is/weight_mean`` when weighted."""
    means = stats.double().mean(0).tolist() if stats.shape[0] else [0.0] * len(STAT_NAMES)
    diag = dict(zip(DIAGNOSTICS.values(), means))
    if weights is not None:
        diag["is/weight_mean"] = float(weights.mean())
    return diag


def loss_step(trial: TrialConfig, engine, teacher, rollouts: Rollouts, pad_id: int, gen: torch.Generator,
              step: int | None = None):
    """Teacher and student forward on the rollouts and the configured divergence over
    completion tokens (module docstring). Returns ``(loss, diagnostics)``: a 0-dim
    tensor (nats) with gradient to the student, and the `diagnostics` floats; at an
    `oracle_due` ``step`` (the 1-based optimizer step) they include the `oracle`'s
    ``estimator/*`` keys. ``teacher``: a `teacher.LocalTeacher` (the model in this worker) or a
    `teacher.SharedTeacher` (``teacher.serve: shared``), whose request adds ``teacher/bytes_per_token``
    and ``teacher/request_ms``; a ``topk`` payload runs the configured estimator on the rebuilt logits
    (the reference path).

    With ``loss.importance_weight`` or ``rollout.staleness_correction: tis`` each sequence's loss is multiplied by
    `importance_weights` (the rollout policy's log p_θ at its sampling τ against the
    engine's logprobs in ``rollouts.logprobs``).

    Raises:
        ValueError: rollouts whose logprobs do not cover every completion token
            (with ``loss.importance_weight``); lm_head vocabularies that differ
            without ``loss.pad_vocab`` (both sizes named).
    """
    L = trial.loss
    batch = pack_batch(rollouts, pad_id, model_device(engine.module))
    fwd = forward(engine, teacher, batch, L.pad_vocab, trial, oracle_due(L, step))
    weights = None
    if L.importance_weight or trial.rollout.staleness_correction == "tis":
        weights = importance_weights(trial, rollouts, batch.cmask, _policy_logp(trial, fwd))
    impl = loss_impl(L) if fwd.t_logits is None else "reference"  # a top-k payload: the rebuilt logits
    out = LOSSES[impl](fwd, L, weights, gen)
    diag = {**diagnostics(out.stats, weights), **fwd.teacher_metrics}
    if oracle_due(L, step):
        diag.update(oracle(fwd, L, weights, out))
    return out.loss, diag
