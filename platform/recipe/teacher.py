r"""The shared teacher service (``teacher.serve: shared``; issue 35, item 2; DESIGN.md "The
teacher service"): one `TeacherScorer` per Ray node, started once per sweep by
`start_teacher_service`, answers every concurrent trial's batches; a trial holds only the
teacher's lm_head (`load_lm_head`) and its client, `SharedTeacher`.

    trial ──`TeacherRequest` (teacher input_ids, attention_mask, position_ids: (B, T) each)──▶ service
          ◀─ ``hidden``: h_T (B, T, H_T)         the trial applies its own copy of the lm_head and runs
                                                 the chunked full-vocabulary op: the loss is exact
          ◀─ ``topk``:   the k largest log π_T (B, T, k) at the loss's τ_T, their token ids (B, T, k)
                         and the tail's log-mass log(1 − Σ_top-k π_T) (B, T): TRL's server
                         distillation and NeMo-RL's payload (`distillab.recipe.payload`); on an oracle step
                         (``loss.oracle_every``) also h_T, so the oracle measures the truncation

What the ``topk`` payload trains on (`topk_logits`): the teacher distribution rebuilt from those
numbers alone, with the top-k entries exact and the tail mass spread uniformly over the other
V − k tokens,

    π̂_T(v) = π_T(v)                          for v in K (the k ids sent),
    π̂_T(v) = (1 − Σ_{u∈K} π_T(u)) / (V − k)   for v ∉ K,

so the configured ``loss.kind`` and ``loss.estimator`` run unchanged on π̂_T: e.g. the forward KL
becomes KL(π̂_T‖π_S) = Σ_{v∈K} π_T(v) log(π_T(v)/π_S(v)) + Σ_{v∉K} π̂_T(v) log(π̂_T(v)/π_S(v)),
and the reverse KL(π_S‖π̂_T). π̂_T = π_T when k = V (the tail is then empty). The loss's
per-token diagnostics (``kl/forward``, ``teacher/entropy``, ...) are π̂_T's too; the oracle
(`loss.oracle`) compares the loss with the exact divergence against π_T. The step reports the
payload's bytes per token (`distillab.recipe.payload.payload_bytes_per_token`, the values' and ids' dtypes
as sent: hidden states in the teacher's dtype, log-probs float32, ids int32) and the request's
wall milliseconds (``teacher/bytes_per_token``, ``teacher/request_ms``).

Faults: the service's actors are restarted by Ray when they die (``max_restarts=-1``; a call in
flight is retried, ``max_task_retries``); a trial's failure touches nothing in them (they hold no
trial state but request counts, `TeacherScorer.stats`).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import ray
import torch
import torch.nn.functional as F
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from distillab.config import RuntimeContext, TeacherConfig, TrialConfig
from distillab.models import DTYPES, bf16_matmuls, load_model
from distillab.recipe.payload import payload_bytes_per_token
from distillab.registry import OFFPD, SPECTRUM
from distillab.rollout.actor import resolve_engine

__all__ = ["SERVICE_NAMESPACE", "TeacherRequest", "TeacherAnswer", "TeacherScorer", "SharedTeacher",
           "LocalTeacher", "teacher_hidden", "load_lm_head", "topk_payload", "topk_logits", "start_teacher_service",
           "stop_teacher_service", "service_stats", "connect_teacher", "samples_with_teacher", "shared_teacher"]

#: The Ray namespace of the service's named actors (trials find their node's actor by name there).
SERVICE_NAMESPACE = "distillab"
#: Rows of (row, V) logits the service holds at once when it computes a top-k payload.
TOPK_CHUNK = 1024


def teacher_hidden(teacher, inputs: dict) -> torch.Tensor:
    """The teacher's final hidden states, in inference mode, from its transformer alone
    (``base_model``: no lm_head, no per-layer output capture): (B, T, H_T) in the teacher's
    dtype, not an autograd leaf (inference tensors are never saved for backward; the loss reads
    rows of it). The one teacher forward of the loss: in the worker (`loss.forward`) and in the
    service (`TeacherScorer.answer`)."""
    with torch.inference_mode():
        return teacher.base_model(**inputs).last_hidden_state


def topk_payload(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, k: int,
                 tau_t: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``topk`` payload of hidden states ``h`` (..., H) under the lm_head ``w`` (V, H), ``b``
    (V,) or None: log π_T = log_softmax(z_T / ``tau_t``) computed in float32, its ``k`` largest
    values (..., k) float32 (descending), their token ids (..., k) int32, and the tail's log-mass
    log Σ_{v∉K} π_T(v) (...,) float32 (a log-sum-exp over the other entries: no cancellation;
    −inf when k = V). Rows are processed `TOPK_CHUNK` at a time.

    Raises:
        ValueError: ``k`` outside [1, V]."""
    V = w.shape[0]
    if not 1 <= k <= V:
        raise ValueError(f"teacher.top_k must be in [1, {V}] (the teacher's lm_head rows), got {k}")
    rows = h.reshape(-1, h.shape[-1])
    vals, ids, tails = [], [], []
    for lo in range(0, rows.shape[0], TOPK_CHUNK):
        logp = torch.log_softmax(F.linear(rows[lo:lo + TOPK_CHUNK], w, b).float() / tau_t, dim=-1)  # (c, V)
        top = logp.topk(k, dim=-1)
        vals.append(top.values)
        ids.append(top.indices.to(torch.int32))
        tails.append(logp.scatter(-1, top.indices, float("-inf")).logsumexp(-1))
    shape = h.shape[:-1]
    return (torch.cat(vals).reshape(*shape, k), torch.cat(ids).reshape(*shape, k), torch.cat(tails).reshape(shape))


def topk_logits(values: torch.Tensor, ids: torch.Tensor, tail: torch.Tensor, vocab_size: int,
                tau_t: float) -> torch.Tensor:
    """Teacher logits z̃ (..., V) float32 of the distribution π̂_T a ``topk`` payload stands for
    (module docstring): softmax(z̃ / ``tau_t``) = π̂_T, with z̃ = τ_T · log π̂_T, i.e.
    log π̂_T(v) = ``values`` at ``ids`` and ``tail`` − log(V − k) elsewhere (−inf when k = V).

    Args:
        values: (..., k) log π_T of the k ids (float32). ids: (..., k) their token ids.
        tail: (...,) log Σ_{v∉K} π_T(v). vocab_size: V, the teacher's lm_head rows.
        tau_t: the loss's teacher temperature (``loss.tau_t``), the one the payload was made at.

    Raises:
        ValueError: k > V."""
    k = values.shape[-1]
    if k > vocab_size:
        raise ValueError(f"topk payload of {k} entries for a vocabulary of {vocab_size}")
    rest = vocab_size - k
    fill = tail.float() - math.log(rest) if rest else torch.full_like(tail, float("-inf"), dtype=torch.float32)
    logp = fill.unsqueeze(-1).expand(*tail.shape, vocab_size).clone()
    logp.scatter_(-1, ids.long(), values.float())
    return logp * tau_t


def load_lm_head(path: str | Path, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The teacher's lm_head (``w`` (V, H), ``b`` (V,) or None) in ``dtype``, read from the
    checkpoint's safetensors alone (not the whole model): the tensor names of the model's output
    embeddings (with tied embeddings, the input embeddings' names too) come from the architecture
    built on the meta device; the first name the checkpoint stores is read (``model.safetensors``
    or the shards of ``model.safetensors.index.json``).

    Raises:
        FileNotFoundError: no safetensors there, or none holds the lm_head (the names tried listed)."""
    path = Path(path)
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    params = dict(model.named_parameters(remove_duplicate=False))

    def names(t):
        return [n for n, p in params.items() if p is t]

    index = path / "model.safetensors.index.json"
    where = (json.loads(index.read_text())["weight_map"] if index.exists()
             else {n: "model.safetensors" for n in params})

    def read(cands: list[str]) -> torch.Tensor | None:
        for n in cands:
            f = path / where.get(n, "")
            if n in where and f.is_file():
                with safe_open(str(f), framework="pt") as s:
                    if n in set(s.keys()):  # safe_open has keys(), no __contains__
                        return s.get_tensor(n).to(dtype)
        return None

    w = read(names(head.weight))
    if w is None:
        raise FileNotFoundError(f"{path}: no safetensors file holds the teacher's lm_head (tried {names(head.weight)})")
    bias = getattr(head, "bias", None)
    return w, None if bias is None else read(names(bias))


@dataclass
class TeacherRequest:
    """One batch to score: the teacher's model ``inputs`` (``input_ids``, ``attention_mask``,
    ``position_ids``; (B, T) int64 each, on CPU), the ``payload`` (``hidden`` | ``topk``) with its
    ``top_k`` and the loss's ``tau_t``, whether the hidden states come too (``with_hidden``: an
    oracle step of a ``topk`` trial), the trial's ``precision`` and ``attn_implementation`` (the
    teacher is held in it) and its ``trial_id`` (counted, `TeacherScorer.stats`)."""

    inputs: dict
    payload: str
    tau_t: float
    precision: str = "fp32"
    attn_implementation: str | None = None
    top_k: int | None = None
    with_hidden: bool = False
    trial_id: str = ""


class TeacherScorer:
    """The service's process: the teacher checkpoint at ``path`` held once per (precision,
    attention implementation) the trials ask for, in inference mode, on a CUDA device if this
    process sees one (a Ray actor that reserves no GPU sees none), else on the CPU with ``threads``
    torch threads (None: the process's setting). Runs as a Ray actor (`start_teacher_service`) or
    in-process (tests)."""

    def __init__(self, path: str, threads: int | None = None):
        self.path, self.models, self.requests = str(path), {}, {}
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if threads is not None:
            torch.set_num_threads(threads)

    def load(self, precision: str, attn: str | None = None) -> int:
        """Hold the teacher in ``precision`` with attention ``attn`` now (the sweep asks before its
        trials start, so that a checkpoint that does not load fails first). Returns its parameters."""
        return sum(p.numel() for p in self._model(precision, attn).parameters())

    def _model(self, precision: str, attn: str | None):
        key = (precision, attn)
        if key not in self.models:
            teacher = load_model(self.path, DTYPES[precision], attn).eval()
            self.models[key] = teacher.requires_grad_(False).to(self.device)
        return self.models[key]

    def answer(self, req: TeacherRequest) -> dict[str, torch.Tensor]:
        """The payload of ``req`` (module docstring), on CPU: ``{"hidden": (B, T, H_T)}`` (the
        teacher's dtype) for ``hidden`` or ``with_hidden``; ``{"topk_logp": (B, T, k) float32,
        "topk_ids": (B, T, k) int32, "tail_logmass": (B, T) float32}`` for ``topk``."""
        teacher = self._model(req.precision, req.attn_implementation)
        self.requests[req.trial_id] = self.requests.get(req.trial_id, 0) + 1
        inputs = {k: v.to(self.device) for k, v in req.inputs.items()}
        with bf16_matmuls(req.precision, self.device):
            h = teacher_hidden(teacher, inputs)  # (B, T, H_T)
            out = {"hidden": h.cpu()} if req.payload == "hidden" or req.with_hidden else {}
            if req.payload == "topk":
                head = teacher.get_output_embeddings()
                vals, ids, tail = topk_payload(h, head.weight, getattr(head, "bias", None), req.top_k, req.tau_t)
                out.update(topk_logp=vals.cpu(), topk_ids=ids.cpu(), tail_logmass=tail.cpu())
        return out

    def stats(self) -> dict[str, Any]:
        """``{"requests": {trial id: batches answered}, "node": Ray node id or None, "pid": process id}``
        since this process started (a restarted actor is a new process and counts from 0)."""
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"requests": dict(self.requests), "node": node, "pid": os.getpid()}


@dataclass
class TeacherAnswer:
    """A trial's view of one answer: ``h_t`` (B, T, H_T) or None, ``t_logits`` (B, T, V) float32 the
    rebuilt π̂_T's logits of a ``topk`` payload (`topk_logits`) or None, and the request's
    ``metrics`` (``teacher/bytes_per_token``, ``teacher/request_ms``)."""

    h_t: torch.Tensor | None
    t_logits: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


class SharedTeacher:
    """The trial's side of the service: the teacher's lm_head (``w_t`` (V, H), ``b_t``), the
    `TeacherConfig`, and the ``scorer``: the service actor of this node (`connect_teacher`) or a
    `TeacherScorer` in this process. ``vocab_size`` and ``hidden_size`` mirror the model config's."""

    def __init__(self, cfg: TeacherConfig, w_t: torch.Tensor, b_t: torch.Tensor | None, scorer, trial_id: str = ""):
        self.cfg, self.w_t, self.b_t, self.scorer, self.trial_id = cfg, w_t, b_t, scorer, trial_id
        self.vocab_size, self.hidden_size = w_t.shape

    def to(self, device) -> "SharedTeacher":
        """The lm_head moved to ``device`` (the student's); returns self."""
        self.w_t = self.w_t.to(device)
        self.b_t = None if self.b_t is None else self.b_t.to(device)
        return self

    def score(self, trial: TrialConfig, inputs: dict, with_hidden: bool = False) -> TeacherAnswer:
        """`TeacherAnswer` of the batch ``inputs`` ((B, T) tensors on any device) under the trial's
        ``teacher.payload`` at ``loss.tau_t``; ``with_hidden``: a ``topk`` trial's oracle step."""
        c = self.cfg
        req = TeacherRequest({k: v.cpu() for k, v in inputs.items()}, c.payload, trial.loss.tau_t, trial.precision,
                             trial.attn_implementation, c.top_k, with_hidden, self.trial_id)
        t0 = time.perf_counter()
        out = (ray.get(self.scorer.answer.remote(req)) if isinstance(self.scorer, ray.actor.ActorHandle)
               else self.scorer.answer(req))
        ms = (time.perf_counter() - t0) * 1e3
        device, sizes = self.w_t.device, {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size}
        h, t_logits = (out["hidden"].to(device) if "hidden" in out else None), None
        if c.payload == "hidden":
            sent = payload_bytes_per_token("hidden", **sizes, value_bytes=h.element_size())
        else:
            vals, ids, tail = out["topk_logp"], out["topk_ids"], out["tail_logmass"]
            sent = payload_bytes_per_token("topk", **sizes, top_k=c.top_k, value_bytes=vals.element_size(),
                                           index_bytes=ids.element_size())
            t_logits = topk_logits(vals, ids, tail, self.vocab_size, trial.loss.tau_t).to(device)
        return TeacherAnswer(h, t_logits, {"teacher/bytes_per_token": float(sent), "teacher/request_ms": ms})


class LocalTeacher:
    """The loss's teacher held in the trial's worker (``teacher.serve: worker``): the model itself,
    with `SharedTeacher`'s interface, so that the loss (`loss.forward`) asks either the same way.
    ``score`` runs `teacher_hidden` here (a `TeacherAnswer` with h_T (B, T, H_T) in the model's dtype,
    no rebuilt logits, no request metrics); ``w_t`` (V, H) and ``b_t`` (V,) or None are the model's
    lm_head (live: they follow the model's device); ``vocab_size`` is ``config.vocab_size``."""

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.hidden_size = model.config.vocab_size, model.config.hidden_size

    @property
    def w_t(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @property
    def b_t(self) -> torch.Tensor | None:
        return getattr(self.model.get_output_embeddings(), "bias", None)

    def to(self, device) -> "LocalTeacher":
        """The model moved to ``device`` (the student's); returns self."""
        self.model.to(device)
        return self

    def score(self, trial: TrialConfig | None, inputs: dict, with_hidden: bool = False) -> TeacherAnswer:
        """`TeacherAnswer` of the batch ``inputs`` ((B, T) tensors on the model's device): its final
        hidden states; ``trial`` and ``with_hidden`` are `SharedTeacher.score`'s (h_T is always here)."""
        return TeacherAnswer(teacher_hidden(self.model, inputs), None)


def _actor_name(service: str, node_id: str) -> str:
    return f"{service}@{node_id}"


def start_teacher_service(service: str, teacher_path: str | Path, threads: int = 1,
                          models: Iterable[tuple[str, str | None]] = ()) -> list:
    """One `TeacherScorer` actor per alive Ray node, named ``<service>@<node id>`` in
    `SERVICE_NAMESPACE`, hard-pinned to its node, reserving no CPU (it time-shares the node's
    cores with the trials, which wait for its answers) and restarted by Ray if it dies
    (``max_restarts=-1``, calls retried), each holding the teacher in every (precision, attention
    implementation) of ``models`` before this returns (`TeacherScorer.load`; an error there is raised
    here). Ray must be initialised. Returns the handles (end them with `stop_teacher_service`)."""
    cls = ray.remote(TeacherScorer)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    env = {"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}}
    actors = [cls.options(name=_actor_name(service, node), namespace=SERVICE_NAMESPACE, num_cpus=0, max_restarts=-1,
                          max_task_retries=3, runtime_env=env,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
                          ).remote(str(teacher_path), threads) for node in nodes]
    ray.get([a.load.remote(*m) for a in actors for m in models])
    return actors


def service_stats(actors: list) -> list[dict[str, Any]]:
    """Each actor's `TeacherScorer.stats` (the request counts per trial)."""
    return ray.get([a.stats.remote() for a in actors])


def stop_teacher_service(actors: list) -> None:
    """End the service's actors (no restart)."""
    for a in actors:
        ray.kill(a, no_restart=True)


def connect_teacher(service: str):
    """The service actor of the caller's node or, where this node has none (a node that joined
    after the sweep started), any of the service's.

    Raises:
        RuntimeError: the service ``service`` has no actor (not started, or ended)."""
    try:
        return ray.get_actor(_actor_name(service, ray.get_runtime_context().get_node_id()), namespace=SERVICE_NAMESPACE)
    except ValueError:
        named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == SERVICE_NAMESPACE and a["name"].startswith(f"{service}@")]
        if not named:
            raise RuntimeError(f"teacher.serve 'shared': no actor of the teacher service {service!r} is running "
                               "(distillab sweep starts it before the trials)") from None
        return ray.get_actor(named[0], namespace=SERVICE_NAMESPACE)


def samples_with_teacher(trial: TrialConfig) -> bool:
    """Whether the trial's worker needs the whole teacher model to sample its rollouts: the
    λ-spectrum, and OffPD without a prepared set (``rollout.offpd_reuse``) sampled in-process (the
    transformers engine, `rollout.actor.resolve_engine`; a vLLM actor loads its own). With
    ``teacher.serve: shared`` the worker then loads the teacher for sampling, and scores through
    the service all the same."""
    r = trial.rollout
    in_process = resolve_engine(r.engine, batched=False) == "transformers"
    return r.policy == SPECTRUM or (r.policy == OFFPD and not r.offpd_reuse and in_process)


def shared_teacher(trial: TrialConfig, ctx: RuntimeContext, trial_id: str) -> SharedTeacher:
    """The trial's `SharedTeacher`: the lm_head from ``ctx.teacher_path`` in the trial's precision and
    the actor of the sweep's service ``ctx.teacher_service`` on this node.

    Raises:
        RuntimeError: no service in ``ctx`` (a trial run outside ``distillab sweep``) or none running."""
    if ctx.teacher_service is None:
        raise RuntimeError("teacher.serve 'shared' needs the sweep's teacher service (runtime context "
                           "teacher_service), which distillab sweep starts; run the trial with teacher.serve 'worker'")
    w, b = load_lm_head(ctx.teacher_path, DTYPES[trial.precision])
    return SharedTeacher(trial.teacher, w, b, connect_teacher(ctx.teacher_service), trial_id)
