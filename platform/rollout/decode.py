r"""Batched sampling from a Llama-family causal LM with a static KV cache: the decode
loop of `rollout.engine.TransformersEngine` and the λ-spectrum sampler, without the
per-token Python work of ``generate()``.

    prefill    one forward pass over the left-padded prompts (B, T), K/V written into a
               preallocated (B, kv_heads, T + max_tokens, head_dim) buffer per layer
    per token  scores = processor(ids, logits) (optional) → / τ → top-p → softmax →
               ``torch.multinomial``, exactly as ``generate(do_sample=True)`` samples;
               finished rows get the pad token; stop when every row has emitted eos;
               then one forward pass of the (B, 1) new tokens through the same layers

The forward pass is the model's own arithmetic, op for op (transformers' ``LlamaModel`` /
``Qwen2Model``): the same ``nn.Linear`` weights and biases, RMSNorm in float32, the
model's own ``rotary_emb`` (evaluated once for every position of the call), SDPA with
the same boolean mask (transformers' ``create_causal_mask`` for the prefill; for a
decode step the padding mask, or none when nothing is padded, as transformers builds
it). What it drops is the work around that arithmetic at every step: module hooks and
output capturing, mask construction, ``DynamicCache`` concatenation,
``prepare_inputs_for_generation``, stopping-criteria objects and per-step logits lists.
With generate()'s positions (``arange`` over the padded width: transformers 5
``generate`` passes no ``position_ids``), the scores equal ``generate()``'s and, under
the same global RNG state, so do the sampled tokens (tests/rollout/test_decode.py checks
token for token, and the logprobs to 1e-6).

`static_decode_supported` says which models take this path (Llama / Qwen2 with SDPA
attention, plain ``nn.Linear`` layers, full parameters, a static RoPE); the engines
call ``generate()`` for every other model (peft adapters, 4-bit layers, ZeRO-3
partitions, other architectures).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import LlamaForCausalLM, Qwen2ForCausalLM, TemperatureLogitsWarper, TopPLogitsWarper
from transformers.masking_utils import create_causal_mask

from distillab.ops.kl import token_logprobs

__all__ = ["static_decode_supported", "StaticKVDecoder", "sample_tokens", "generate_positions"]

#: Architectures whose decoder layer is Llama's (pre-norm RMSNorm, rotary SDPA attention, gated MLP).
ARCHITECTURES = (LlamaForCausalLM, Qwen2ForCausalLM)
#: RoPE variants whose frequencies do not depend on the sequence length seen so far.
STATIC_ROPE = ("default", "linear", "llama3")


def static_decode_supported(model) -> bool:
    """True when `StaticKVDecoder` reproduces ``model``'s forward pass: a
    ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` with SDPA attention, a static RoPE
    (`STATIC_ROPE`), no sliding window, every linear layer a plain ``nn.Linear`` (no
    peft adapter, no 4-bit layer), no DeepSpeed ZeRO-3 partitioned parameter, and the
    SiLU gate of both architectures."""
    if type(model) not in ARCHITECTURES:
        return False
    cfg = model.config
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if cfg._attn_implementation != "sdpa" or rope not in STATIC_ROPE or cfg.hidden_act != "silu":
        return False
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    projections = [model.lm_head] + [m for layer in model.model.layers for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    if any(type(m) is not torch.nn.Linear for m in projections):  # a peft LoRA layer, a bitsandbytes Linear4bit
        return False
    return not any(hasattr(p, "ds_id") for p in model.parameters())


def generate_positions(batch: int, width: int, device=None) -> Tensor:
    """The positions ``generate()`` gives a left-padded batch (transformers 5 passes no
    ``position_ids``, so the model counts from 0 over the padded width): int64
    ``(batch, width)``, each row ``0 .. width-1``."""
    return torch.arange(width, device=device).unsqueeze(0).expand(batch, width)


@dataclass
class _Layer:
    """One decoder layer's weights: the q/k/v and gate/up projections concatenated
    along their outputs (one GEMM each: every output column is the same dot product as
    in its own ``nn.Linear``, so the values are unchanged), the others as they are."""

    ln1: Tensor
    eps1: float
    qkv_w: Tensor
    qkv_b: Tensor | None
    o: torch.nn.Linear
    ln2: Tensor
    eps2: float
    gu_w: Tensor
    gu_b: Tensor | None
    down: torch.nn.Linear


def _cat(*linears: torch.nn.Linear) -> tuple[Tensor, Tensor | None]:
    w = torch.cat([m.weight for m in linears])
    b = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
    return w, b


def _layer_weights(layer) -> _Layer:
    a, m = layer.self_attn, layer.mlp
    return _Layer(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, *_cat(a.q_proj, a.k_proj, a.v_proj),
                  a.o_proj, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                  *_cat(m.gate_proj, m.up_proj), m.down_proj)


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """transformers' LlamaRMSNorm, op for op (float32 statistics)."""
    dt = x.dtype
    y = x.to(torch.float32)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(dt)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticKVDecoder:
    """The forward pass of a supported model (`static_decode_supported`) over a batch of
    ``B`` left-padded prompts and up to ``max_new`` generated tokens, with a static KV cache.

    Args:
        model: the causal LM (its current weights are read at every call; no copy).
        attention_mask: (B, T) int64/bool, 1 on the prompts' real tokens.
        max_new: most tokens that will be generated (cache width T + max_new).
        positions: (B, T + max_new) int64 position of every slot (default:
            `generate_positions`, what ``generate()`` uses; the λ-spectrum's second model
            passes ``rollout.types.position_ids`` continued by one per generated token).

    Call `prefill` once with the (B, T) prompt ids, then `step` with each (B,) new token;
    both return the (B, V) float32 logits of the last position.
    """

    def __init__(self, model, attention_mask: Tensor, max_new: int, positions: Tensor | None = None):
        cfg, inner = model.config, model.model
        B, T = attention_mask.shape
        self.B, self.T, self.width = B, T, T + max_new
        dev, dt = inner.embed_tokens.weight.device, inner.embed_tokens.weight.dtype
        self.cfg, self.inner, self.head = cfg, inner, model.lm_head
        self.heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.layers = [_layer_weights(l) for l in inner.layers[: cfg.num_hidden_layers]]
        self.kv = cfg.num_key_value_heads * self.head_dim
        self.inter = cfg.intermediate_size
        shape = (B, cfg.num_key_value_heads, self.width, self.head_dim)
        self.k_cache = [torch.empty(shape, dtype=dt, device=dev) for _ in self.layers]
        self.v_cache = [torch.empty(shape, dtype=dt, device=dev) for _ in self.layers]
        self.attn = attention_mask.to(dev)
        padded = not bool(self.attn.bool().all())
        # decode-step masks: the padding mask over every slot (None when nothing is padded, as transformers skips it)
        self.full_mask = torch.cat([self.attn.bool(), torch.ones(B, max_new, dtype=torch.bool, device=dev)], 1)[
            :, None, None, :] if padded else None
        pos = generate_positions(B, self.width, dev) if positions is None else positions.to(dev)
        probe = torch.empty(1, dtype=dt, device=dev)
        self.cos, self.sin = inner.rotary_emb(probe, pos)  # (B, width, head_dim) each, the model's own RoPE
        self.pos = pos
        self.t = 0

    def _layer(self, i: int, L: _Layer, h: Tensor, cos: Tensor, sin: Tensor, mask, is_causal: bool) -> Tensor:
        B, q, d = h.shape[0], h.shape[1], self.head_dim
        x = _rms(h, L.ln1, L.eps1)
        qkv = F.linear(x, L.qkv_w, L.qkv_b).view(B, q, -1, d).transpose(1, 2)  # (B, heads + 2 kv, q, d)
        nq, nk = self.heads, self.kv // d
        qk = qkv[:, : nq + nk]  # queries and keys share the rotation (elementwise: the same values as one at a time)
        qk = qk * cos + _rotate_half(qk) * sin
        t0, t1 = self.t, self.t + q
        kc, vc = self.k_cache[i], self.v_cache[i]
        kc[:, :, t0:t1] = qk[:, nq:]
        vc[:, :, t0:t1] = qkv[:, nq + nk :]
        keys, values = kc[:, :, :t1], vc[:, :, :t1]
        kw = {}
        if self.groups > 1:
            if mask is None:
                kw["enable_gqa"] = True
            else:
                keys = keys.repeat_interleave(self.groups, dim=1)
                values = values.repeat_interleave(self.groups, dim=1)
        a = F.scaled_dot_product_attention(qk[:, :nq], keys, values, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                           is_causal=is_causal, **kw)
        h = h + F.linear(a.transpose(1, 2).reshape(B, q, -1), L.o.weight, L.o.bias)
        gu = F.linear(_rms(h, L.ln2, L.eps2), L.gu_w, L.gu_b)  # (B, q, 2 · intermediate)
        return h + F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter :], L.down.weight, L.down.bias)

    def _forward(self, ids: Tensor, mask, is_causal: bool) -> Tensor:
        q = ids.shape[1]
        h = F.embedding(ids, self.inner.embed_tokens.weight, self.inner.embed_tokens.padding_idx)
        cos = self.cos[:, self.t : self.t + q].unsqueeze(1)  # (B, 1, q, d)
        sin = self.sin[:, self.t : self.t + q].unsqueeze(1)
        for i, L in enumerate(self.layers):
            h = self._layer(i, L, h, cos, sin, mask, is_causal)
        self.t += q
        n = self.inner.norm
        h = _rms(h[:, -1:], n.weight, n.variance_epsilon)
        return F.linear(h, self.head.weight, getattr(self.head, "bias", None))[:, -1].to(torch.float32)  # (B, V)

    def prefill(self, ids: Tensor) -> Tensor:
        """Forward of the (B, T) prompts (the mask is transformers' own causal mask); returns (B, V) float32."""
        if self.t:
            raise RuntimeError("prefill: the decoder has already been used")
        embeds = torch.empty(self.B, self.T, 1, device=self.attn.device)
        mask = create_causal_mask(config=self.cfg, inputs_embeds=embeds, attention_mask=self.attn,
                                  past_key_values=None, position_ids=self.pos[:, : self.T])
        return self._forward(ids, mask, mask is None and self.T > 1)

    def step(self, tokens: Tensor) -> Tensor:
        """Forward of the (B,) new tokens at the next slot; returns (B, V) float32.

        Raises:
            RuntimeError: the cache is full (more than ``max_new`` steps).
        """
        if self.t >= self.width:
            raise RuntimeError(f"step: cache of {self.width} slots is full")
        mask = None if self.full_mask is None else self.full_mask[..., : self.t + 1]
        return self._forward(tokens.view(self.B, 1), mask, False)


def sample_tokens(model, ids: Tensor, attention_mask: Tensor, *, temperature: float, top_p: float, max_new: int,
                  eos_token_id: int, pad_token_id: int, processor=None, logprobs: bool = True
                  ) -> tuple[Tensor, Tensor | None]:
    """Sample up to ``max_new`` tokens for each left-padded prompt as
    ``model.generate(do_sample=True, temperature, top_p, top_k=0, ...)`` does, with
    `StaticKVDecoder` (``model`` must pass `static_decode_supported`).

    Per step: the float32 logits of the last position; ``processor(ids_so_far, scores)``
    when given (run first, as generate() merges custom processors before its warpers);
    ``TemperatureLogitsWarper`` when τ ≠ 1 and ``TopPLogitsWarper`` when top-p < 1
    (transformers' own classes); softmax; ``torch.multinomial`` on the global RNG; the pad
    token for rows that have finished. Stops when every row has produced eos, or after
    ``max_new`` tokens.

    Args:
        ids, attention_mask: (B, T) int64 left-padded prompts and their mask.
        temperature, top_p: sampling τ (> 0) and nucleus mass in (0, 1].
        max_new: most new tokens (≥ 1).
        processor: optional logits processor (``__call__(input_ids (B, t), scores (B, V))``).
        logprobs: also return log softmax(logits/τ) of each sampled token (before
            top-p and the processor; `ops.kl.token_logprobs`).

    Returns:
        ``(new, logprobs)``: (B, L) int64 tokens (L ≤ ``max_new``, the longest row; pad
        after a row's eos) and (B, L) float32 logprobs or None.
    """
    B, T = ids.shape
    warpers = ([processor] if processor is not None else []) + \
        ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + \
        ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
    dec = StaticKVDecoder(model, attention_mask, max_new)
    seq = torch.empty(B, T + max_new, dtype=torch.long, device=ids.device)  # prompt + generated (processors read it)
    seq[:, :T] = ids
    lp = torch.zeros(B, max_new, dtype=torch.float32, device=ids.device) if logprobs else None
    unfinished = torch.ones(B, dtype=torch.bool, device=ids.device)
    pad = torch.tensor(pad_token_id, device=ids.device)
    logits = dec.prefill(ids)
    n = 0
    while True:
        scores = logits
        for w in warpers:
            scores = w(seq[:, : T + n], scores)
        tok = torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        tok = torch.where(unfinished, tok, pad)
        seq[:, T + n] = tok
        if lp is not None:
            lp[:, n] = token_logprobs(logits, tok, temperature)
        n += 1
        unfinished &= tok != eos_token_id
        if n == max_new or not bool(unfinished.any()):
            break
        logits = dec.step(tok)
    return seq[:, T : T + n], None if lp is None else lp[:, :n]
