r"""Held-out English prose for the OOD suite of a pretrained model (`evals.ood.PretrainedBackend`):
the topic documents of Python's own help, ``pydoc_data.topics`` (79 documents, 465 KB on
Python 3.11: the reference manual's pages on statements, operators and types), which ship with
the interpreter, so the suite runs offline. No task or stage of distillab trains on them. The
texts are the running interpreter's: another Python version ships other texts, so a number
measured here goes with the Python version that measured it.

The split (fixed, by name)
--------------------------
A topic's rank is the SHA-256 hex digest of its key (``"assert"``, ``"if"``, ...). The held-out
(OOD) split is every topic whose rank starts with a hex digit 0–7 (about half; 47 of the 79 on
Python 3.11.7), ordered by rank; the other topics are the rest, ordered the same way, free for
a general-text stage (none uses them today), never to be mixed with the held-out ones. The split
depends only on the key, so a topic keeps its side across Python versions that add or drop
others. ``evaluation.prose.documents`` scores the first documents of the held-out order.

Scoring (teacher forcing)
-------------------------
Each document is tokenized without special tokens, cut to its first ``tokens_per_document``
tokens, then into consecutive chunks x = (x_0, …, x_{L−1}) of L ≤ ``context`` tokens (the last
chunk of a document shorter; chunks never cross documents). The model reads each chunk alone,
from its first token; position t ≥ 1 is scored with its logits z_{t−1} ∈ R^V after x_0…x_{t−1}:

    ℓ_t = log softmax(z_{t−1})_{x_t}                  (nats; `ops.weights.token_logprobs`, τ = 1)
    c_t = [argmax_v z_{t−1, v} = x_t]                 (1 if the most likely next token is x_t)

so a chunk of L tokens scores L − 1 positions, and the first token of each chunk none. Over
the N scored positions of all chunks of all documents (token-weighted: a long document counts
by its tokens, not once):

    loss = −(1/N) Σ ℓ_t   (nats/token; e^loss is the perplexity)
    next-token accuracy = (1/N) Σ c_t   ∈ [0, 1]

The logits are the model's (float32 for a float32 model); the log-softmax is computed in float32
(float64 for a float64 model), the sums over positions in float64.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from distillab.config import ProseConfig
from distillab.ops.weights import token_logprobs
from distillab.rollout.types import model_device, position_ids

#: The task name of the prose rows (``eval/<stage>/ood/prose/<metric>``)
PROSE_TASK = "ood/prose"


def topic_rank(key: str) -> str:
    """A topic's rank: the SHA-256 hex digest of its key (UTF-8)."""
    return hashlib.sha256(key.encode()).hexdigest()


def prose_split() -> tuple[list[str], list[str]]:
    """``(held_out, rest)``: the keys of ``pydoc_data.topics`` whose `topic_rank` starts with 0–7,
    and the others, each ordered by rank (module docstring)."""
    from pydoc_data.topics import topics

    keys = sorted(topics, key=topic_rank)
    return [k for k in keys if topic_rank(k)[0] in "01234567"], [k for k in keys if topic_rank(k)[0] not in "01234567"]


def prose_documents(n: int | None) -> list[str]:
    """The texts of the first ``n`` held-out topics (`prose_split`; all of them for None or an
    ``n`` beyond the split)."""
    from pydoc_data.topics import topics

    return [topics[k] for k in prose_split()[0][:n]]


def prose_chunks(tokenizer: Any, texts: list[str], tokens_per_document: int | None, context: int) -> list[list[int]]:
    """Each text's first ``tokens_per_document`` token ids (all for None; no special tokens), in
    consecutive chunks of at most ``context`` (module docstring); documents in order."""
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens_per_document]
        out += [ids[lo: lo + context] for lo in range(0, len(ids), context)]
    return out


@torch.no_grad()
def next_token_scores(model: Any, chunks: list[list[int]], batch_size: int) -> tuple[float, int, int]:
    """``(Σ −ℓ_t, Σ c_t, N)`` over every scored position of ``chunks`` (module docstring):
    the summed negative log-likelihood (nats, float64 sum), the count of correct argmax
    predictions, and the number of scored positions (Σ (len(chunk) − 1)).

    ``batch_size`` chunks per forward pass, right-padded (attention mask 0 on the padding;
    positions count real tokens only, `rollout.types.position_ids`): ``input_ids`` (B, L)
    int64, logits (B, L, V) in the model's dtype, ℓ (B, L − 1) float32 (float64 for a float64
    model). A padded position is neither read (causal attention: it comes after every real
    token of its row) nor scored.
    """
    dev = model_device(model)
    nll, correct, n = 0.0, 0, 0
    for lo in range(0, len(chunks), batch_size):
        batch = chunks[lo: lo + batch_size]
        width = max(len(c) for c in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        attn = torch.zeros(len(batch), width, dtype=torch.long)
        for i, c in enumerate(batch):
            ids[i, : len(c)], attn[i, : len(c)] = torch.tensor(c, dtype=torch.long), 1
        ids, attn = ids.to(dev), attn.to(dev)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits[:, :-1]
        targets, scored = ids[:, 1:], attn[:, 1:].bool()  # (B, L - 1)
        logp = token_logprobs(logits, targets)
        nll -= float(logp[scored].double().sum())
        correct += int((logits.argmax(-1) == targets)[scored].sum())
        n += int(scored.sum())
    return nll, correct, n


def prose_rows(model: Any, tokenizer: Any, texts: list[str], cfg: ProseConfig) -> list[dict]:
    """The rows ``{task: "ood/prose", metric: "loss" | "next_token_accuracy", value, n}`` of
    ``texts`` (`prose_documents`) under ``cfg`` (``evaluation.prose``): ``n`` = N scored tokens.

    Raises:
        ValueError: ``cfg.context`` above the model's ``max_position_embeddings``; no position
            to score (every chunk a single token).
    """
    longest = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if longest is not None and cfg.context > longest:
        raise ValueError(f"evaluation.prose.context is {cfg.context}, more than the model's "
                         f"max_position_embeddings {longest}")
    chunks = prose_chunks(tokenizer, texts, cfg.tokens_per_document, cfg.context)
    nll, correct, n = next_token_scores(model, chunks, cfg.batch_size)
    if n == 0:
        raise ValueError("evaluation.prose: no token to score (every chunk is a single token)")
    return [{"task": PROSE_TASK, "metric": "loss", "value": nll / n, "n": n},
            {"task": PROSE_TASK, "metric": "next_token_accuracy", "value": correct / n, "n": n}]


__all__ = ["PROSE_TASK", "next_token_scores", "prose_chunks", "prose_documents", "prose_rows", "prose_split",
           "topic_rank"]
