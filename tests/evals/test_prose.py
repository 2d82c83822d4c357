"""The pretrained OOD backend (``evaluation.ood_backend: pretrained``, `distillab.evals.prose`): the fixed
split of ``pydoc_data.topics``, the chunking, the teacher-forced loss and next-token accuracy against a
float64 reference on a tiny model (odd lengths, a padded batch, chunk boundaries), the backend's rows
and ``ood_mean``, and SmolLM2-135M-Instruct's prose loss in a pretrained model's band."""

from __future__ import annotations

import hashlib
import math

import _tolerance as tol
import pytest
import torch
from pydoc_data.topics import topics
from transformers import LlamaConfig, LlamaForCausalLM

from distillab.config import EvaluationConfig, ProseConfig, TasksConfig, TrialConfig
from distillab.evals.ood import MicroSkillsBackend, PretrainedBackend, mean_row, ood_backend
from distillab.evals.prose import next_token_scores, prose_chunks, prose_documents, prose_rows, prose_split


def test_the_split_is_fixed_by_each_topic_name() -> None:
    """Held out: the topics whose SHA-256 starts with 0-7, ordered by it; the rest the others; together all 79
    (Python 3.11's ``pydoc_data``; another version may ship other topics, each keeps its side)."""
    held, rest = prose_split()
    digest = {k: hashlib.sha256(k.encode()).hexdigest() for k in topics}
    assert sorted(held + rest) == sorted(topics) and not set(held) & set(rest)
    assert all(digest[k] < "8" for k in held) and all(digest[k] >= "8" for k in rest)
    assert [digest[k] for k in held] == sorted(digest[k] for k in held)
    assert "with" in held and "if" in rest  # sha256("with") = 0695…, sha256("if") = 935f…
    assert prose_documents(3) == [topics[k] for k in held[:3]]
    assert prose_documents(None) == prose_documents(10_000) == [topics[k] for k in held]


class CharIds:
    """A tokenizer stand-in: one id per character (its code point)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def test_chunks_cut_each_document_then_never_cross_it() -> None:
    chunks = prose_chunks(CharIds(), ["abcdefg", "xy", "z"], tokens_per_document=6, context=4)
    assert chunks == [[97, 98, 99, 100], [101, 102], [120, 121], [122]]
    assert prose_chunks(CharIds(), ["abcdefg"], None, 3) == [[97, 98, 99], [100, 101, 102], [103]]


def _tiny_llama(vocab: int = 37) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    return LlamaForCausalLM(cfg).eval()


def _reference(model64: LlamaForCausalLM, chunks: list[list[int]]) -> tuple[float, list[float], list[bool], list[float]]:
    """Float64, each chunk alone (no padding): Σ −ℓ_t, each −ℓ_t, each c_t and each position's top-2 logit gap,
    with ℓ = (z − max z) − log Σ exp(z − max z) written out."""
    nll, correct, gaps = [], [], []
    for c in chunks:
        if len(c) < 2:
            continue
        with torch.no_grad():
            z = model64(input_ids=torch.tensor([c])).logits[0, :-1]  # (L - 1, V) float64
        d = z - z.max(-1, keepdim=True).values
        logp = d - d.exp().sum(-1, keepdim=True).log()
        for t, y in enumerate(c[1:]):
            nll.append(-float(logp[t, y]))
            correct.append(int(z[t].argmax()) == y)
            top2 = z[t].topk(2).values
            gaps.append(float(top2[0] - top2[1]))
    return math.fsum(nll), nll, correct, gaps


def test_loss_and_accuracy_equal_a_float64_reference_on_odd_shapes() -> None:
    """Chunks of 7, 1, 5, 3, 16, 2 tokens, 4 per forward pass: a right-padded batch with a one-token chunk
    (nothing to score) and a second, smaller batch; a chunk at the model's longest context (16). N is
    Σ (L − 1) = 6 + 0 + 4 + 2 + 15 + 1 = 28. Bound per position (tests/_tolerance.py): the padded float32
    logits err by at most 2E (E: ``forward_err`` of each chunk alone; another computation of the same
    output), so ℓ by 2·2E plus its log-softmax's ``row`` bound ρ per unit of magnitude (2 + |ℓ|); the
    sums over N add γ_N (float64) each. The argmax can differ only where the top two float64 logits are
    within 2·2E."""
    model = _tiny_llama()
    gen = torch.Generator().manual_seed(1)
    chunks = [torch.randint(0, 37, (n,), generator=gen).tolist() for n in (7, 1, 5, 3, 16, 2)]
    nll, correct, n = next_token_scores(model, chunks, batch_size=4)
    assert n == 28
    model64 = _tiny_llama().to(torch.float64)
    ref, nlls, hits, gaps = _reference(model64, chunks)
    E = max(tol.forward_err(lambda m, c=c: m(input_ids=torch.tensor([c])).logits, model) for c in chunks)
    with torch.no_grad():
        A = max(tol.logit_range((model64(input_ids=torch.tensor([c])).logits, 1.0)) for c in chunks)
    rho = tol.both(tol.row, 37, torch.float32, A)
    bound = sum(2 * 2 * E + rho * (2 + x) for x in nlls) + 2 * tol.gamma(n) * ref
    assert abs(nll - ref) <= bound, (nll, ref, bound)
    ambiguous = sum(g <= 2 * 2 * E for g in gaps)
    assert abs(correct - sum(hits)) <= ambiguous
    assert 0 < sum(hits) < n  # a random model is right on some positions and wrong on others


def test_prose_rows_are_token_weighted_and_refuse_a_context_beyond_the_model() -> None:
    """Two documents of 7 and 3 characters (ids = code points < 128) at context 4: chunks 4+3 and 3, N = 3 + 2 + 2;
    the rows are the sums over all of them (`next_token_scores`, the same batches) divided by N."""
    model = _tiny_llama(vocab=128)
    texts = ["abcdefg", "xyz"]
    rows = prose_rows(model, CharIds(), texts, ProseConfig(documents=2, tokens_per_document=None, context=4,
                                                           batch_size=2))
    nll, correct, n = next_token_scores(model, [[97, 98, 99, 100], [101, 102, 103], [120, 121, 122]], 2)
    assert n == 7
    assert rows == [{"task": "ood/prose", "metric": "loss", "value": nll / n, "n": 7},
                    {"task": "ood/prose", "metric": "next_token_accuracy", "value": correct / n, "n": 7}]
    with pytest.raises(ValueError, match=r"evaluation.prose.context is 17, more than the model's "
                                         r"max_position_embeddings 16"):
        prose_rows(_tiny_llama(), CharIds(), texts, ProseConfig(context=17))
    with pytest.raises(ValueError, match="no token to score"):
        prose_rows(model, CharIds(), ["a", "b"], ProseConfig(context=4))


def test_the_backend_reports_prose_then_skills_and_leaves_the_loss_out_of_the_mean() -> None:
    """``ood_backend: pretrained`` (with its ``prose`` block filled in and dumped) gives the prose rows of
    `prose_rows`, the skills' rows of `MicroSkillsBackend` at the same seed, and ``ood_mean`` over the
    five scores in [0, 1], not the loss (nats)."""
    from distillab.models import build_char_tokenizer, micro_llama_config

    tok = build_char_tokenizer()
    torch.manual_seed(3)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 2, 2, 128, 256, tok)).eval()
    trial = TrialConfig.model_validate({"evaluation": {"ood_backend": "pretrained", "ood_items": 3,
                                                       "prose": {"documents": 2, "tokens_per_document": 40,
                                                                 "context": 16}}})
    ev = trial.evaluation
    assert trial.model_dump(mode="json")["evaluation"]["prose"] == {"documents": 2, "tokens_per_document": 40,
                                                                     "context": 16, "batch_size": 4}
    backend = ood_backend(trial.tasks, ev)
    assert isinstance(backend, PretrainedBackend)
    rows = backend.evaluate(model, tok, seed=5)
    prose = prose_rows(model, tok, prose_documents(2), ev.prose)
    skills = MicroSkillsBackend(trial.tasks, ev).evaluate(model, tok, seed=5)
    assert [r["task"] + "/" + r["metric"] for r in rows] == [
        "ood/prose/loss", "ood/prose/next_token_accuracy", "ood/add/accuracy", "ood/mul/accuracy",
        "ood/reverse/accuracy", "ood/sort/accuracy", "ood/ood_mean"]
    assert rows[:2] == prose and rows[2:6] == skills[:4] and rows[0]["n"] == 2 * (15 + 15 + 7)
    assert rows[-1] == mean_row(rows[1:6]) and rows[-1]["n"] == 5
    assert "prose" not in TrialConfig().model_dump(mode="json")["evaluation"]  # other backends: absent, ids unchanged
    assert EvaluationConfig(ood_backend="micro").prose is None


def test_an_unknown_backend_names_the_allowed_ones() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"ood_backend\n  Input should be 'micro', 'lm_eval' or 'pretrained'"):
        TrialConfig.model_validate({"evaluation": {"ood_backend": "prose"}})


def test_smollm2_prose_loss_is_a_pretrained_models(smollm2_dir) -> None:
    """SmolLM2-135M-Instruct (the Q4_1 copy, float32) on the first 2 held-out documents, 128 tokens each
    (chunks of 64, so 2 × 126 scored tokens): measured 3.132 nats/token and next-token accuracy 0.460 on
    Python 3.11.7 (`scripts/prose_ood.py` prints the same rows for a sweep's pair). The band: a uniform
    guess over its 49,152 tokens is ln 49152 = 10.8 nats and accuracy ~0; a pretrained model of this size
    reads English prose at a few nats per token (2.0–4.5) and guesses 0.3–0.7 of the next tokens."""
    from distillab.models import load_model, load_tokenizer

    model, tok = load_model(smollm2_dir).eval(), load_tokenizer(smollm2_dir)
    loss, acc = prose_rows(model, tok, prose_documents(2), ProseConfig(tokens_per_document=128, context=64))
    assert loss["n"] == acc["n"] == 2 * (128 - 2)
    assert 2.0 < loss["value"] < 4.5 and 0.3 < acc["value"] < 0.7, (loss, acc)
