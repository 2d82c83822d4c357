"""`models.Bf16MatmulsInFloat32`: bf16 matrix products on float32 copies of the operands,
rounded to bf16, against torch's native bf16 kernel (the peer: oneDNN's or the generic one,
whichever this CPU has) and a float64 reference, on odd shapes; forward and backward of a
micro Llama under the mode against the native run; and the calls it leaves alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from distillab.models import precision as models
from distillab.models import BF16_MATMULS, Bf16MatmulsInFloat32, bf16_matmuls, build_char_tokenizer, micro_llama_config

B = torch.bfloat16


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 units in the last place between two bf16 tensors of equal signs
    (the int16 bit patterns of same-signed bf16 values are ordered as the values)."""
    assert a.dtype == b.dtype == B
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(B)


def _calls() -> dict[str, tuple]:
    """name -> (function, bf16 args, kwargs, float64 reference of the product), odd shapes."""
    x, w, b = _randn(7, 37, seed=0), _randn(13, 37, seed=1), _randn(13, seed=2)
    a3, b3, c3 = _randn(3, 5, 37, seed=3), _randn(3, 37, 11, seed=4), _randn(3, 5, 11, seed=5)
    m, n, c = _randn(9, 37, seed=6), _randn(37, 6, seed=7), _randn(9, 6, seed=8)
    d = lambda t: t.double()  # noqa: E731
    return {
        "linear": (F.linear, (x, w, b), {}, d(x) @ d(w).T + d(b)),
        "matmul": (torch.matmul, (a3, b3), {}, d(a3) @ d(b3)),
        "__matmul__": (torch.Tensor.__matmul__, (m, n), {}, d(m) @ d(n)),
        "mm": (torch.mm, (m, n), {}, d(m) @ d(n)),
        "bmm": (torch.bmm, (a3, b3), {}, d(a3) @ d(b3)),
        "addmm": (torch.addmm, (c, m, n), {"beta": 0.5, "alpha": 2.0}, 0.5 * d(c) + 2.0 * (d(m) @ d(n))),
        "baddbmm": (torch.baddbmm, (c3, a3, b3), {}, d(c3) + d(a3) @ d(b3)),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_each_product_equals_the_native_bf16_kernel_and_float64(name) -> None:
    """Every element within one bf16 ulp of the native kernel's (both round a float32 sum of
    exact products; only the summation order may differ) and within half a bf16 ulp
    (at most 2^-8 relative: 8 significand bits) plus float32 summation error of the float64
    product."""
    fn, args, kwargs, ref = _calls()[name]
    native = fn(*args, **kwargs)
    seen = []

    class Spy(Bf16MatmulsInFloat32):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    with Spy():
        got = fn(*args, **kwargs)
    assert seen[0] in BF16_MATMULS  # the mode saw the product (a @ b as Tensor.matmul), and computed it on
    # float32 copies, rounded once:
    assert torch.equal(got, fn(*[a.float() for a in args], **kwargs).to(B))
    assert got.dtype == B and got.shape == native.shape
    assert _ulps(got, native).max().item() <= 1
    assert (got == native).float().mean().item() >= 0.95
    err = (got.double() - ref).abs()
    assert (err <= 2.0**-8 * ref.abs() + 1e-5 * ref.abs().max()).all(), err.max()


def test_attention_is_the_float32_attention_rounded_once() -> None:
    """Scaled dot-product attention (causal, and with a boolean mask, which stays boolean):
    the float32 softmax(QKᵀ/√d)V of the bf16 operands rounded once to bf16, i.e. within half a
    bf16 ulp (2^-8 relative) plus float32 error of a float64 reference. torch's native bf16
    kernel (the flash algorithm) also rounds the probabilities to bf16 before multiplying V,
    so it is further from float64 than the mode (measured here: max |error| 0.0053 against
    0.0048) and the two may differ by more than an ulp where an output cancels to near 0."""
    q, k, v = _randn(2, 4, 9, 32, seed=10), _randn(2, 4, 9, 32, seed=11), _randn(2, 4, 9, 32, seed=12)
    mask = torch.rand(9, 9, generator=torch.Generator().manual_seed(13)) > 0.3
    mask.fill_diagonal_(True)
    for kwargs in ({"is_causal": True}, {"attn_mask": mask}):
        native = F.scaled_dot_product_attention(q, k, v, **kwargs)
        with Bf16MatmulsInFloat32():
            got = F.scaled_dot_product_attention(q, k, v, **kwargs)
        allowed = torch.ones(9, 9).tril().bool() if "is_causal" in kwargs else mask
        s = (q.double() @ k.double().transpose(-1, -2) / 32**0.5).masked_fill(~allowed, float("-inf"))
        ref = s.softmax(-1) @ v.double()
        err, err_native = (got.double() - ref).abs(), (native.double() - ref).abs()
        assert got.dtype == B and (err <= 2.0**-8 * ref.abs() + 1e-6).all(), err.max()
        assert err.max() <= err_native.max() and err.mean() <= err_native.mean()


def test_micro_llama_forward_and_backward_match_the_native_run() -> None:
    """A micro student (the study's shape, random weights) in bf16: loss, logits and every
    parameter's gradient under the mode against the native bf16 run. The two differ only by
    the order of float32 sums inside each product, each rounded to bf16, so after three layers
    the logits agree to a few bf16 ulps: loss within 2^-8 relative, every gradient at cosine
    ≥ 0.999 and its norm within 2^-6 relative."""
    tok = build_char_tokenizer()
    config = micro_llama_config(len(tok), 128, 3, 4, 256, 64, tok)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(B)
    ids = torch.randint(3, config.vocab_size, (3, 29), generator=torch.Generator().manual_seed(1))

    def run() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.detach(), out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_n, logits_n, grads_n = run()
    with Bf16MatmulsInFloat32():
        loss_m, logits_m, grads_m = run()
    assert abs(loss_m.double() - loss_n.double()) <= 2.0**-8 * loss_n.double().abs()
    assert (logits_m.double() - logits_n.double()).abs().max() <= 8 * 2.0**-8 * logits_n.double().abs().max()
    for n, g in grads_n.items():
        assert grads_m[n].dtype == B, n
        a, b = grads_m[n].double().flatten(), g.double().flatten()
        assert F.cosine_similarity(a, b, dim=0) >= 0.999, n
        assert abs(a.norm() - b.norm()) <= 2.0**-6 * b.norm(), n


def test_other_calls_run_natively() -> None:
    """float32 products are the same call (bitwise); mixed bf16/float32 operands still raise
    as torch does; ``out=`` writes natively into the given bf16 tensor."""
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with Bf16MatmulsInFloat32():
        assert torch.equal(a @ b, torch.mm(a, b))
        with pytest.raises(RuntimeError):
            torch.mm(a.to(B), b)
        out = torch.empty(5, 3, dtype=B)
        torch.mm(a.to(B), b.to(B), out=out)
    assert torch.equal(out, torch.mm(a.to(B), b.to(B)))


def test_the_mode_is_on_only_for_bf16_on_a_cpu_without_native_bf16(monkeypatch) -> None:
    """`bf16_matmuls`: the mode for ``bf16`` on a CPU that lacks native bf16 products; a no-op
    context for ``fp32``, for a GPU device, and on a CPU that has them. ``DISTILLAB_BF16_MATMULS``
    overrides the CPU check: ``native`` never enters the mode, ``float32`` always does (bf16 on
    CPU only); another value is refused, naming the variable and the allowed values."""
    monkeypatch.delenv("DISTILLAB_BF16_MATMULS", raising=False)
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    assert isinstance(bf16_matmuls("bf16", "cpu"), Bf16MatmulsInFloat32)
    assert not isinstance(bf16_matmuls("fp32", "cpu"), Bf16MatmulsInFloat32)
    assert not isinstance(bf16_matmuls("bf16", "cuda"), Bf16MatmulsInFloat32)
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "native")
    assert not isinstance(bf16_matmuls("bf16", "cpu"), Bf16MatmulsInFloat32)
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "auto")
    assert not isinstance(bf16_matmuls("bf16", "cpu"), Bf16MatmulsInFloat32)
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "float32")
    assert isinstance(bf16_matmuls("bf16", "cpu"), Bf16MatmulsInFloat32)
    assert not isinstance(bf16_matmuls("fp32", "cpu"), Bf16MatmulsInFloat32)
    assert not isinstance(bf16_matmuls("bf16", "cuda"), Bf16MatmulsInFloat32)
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "fp32")
    with pytest.raises(ValueError, match=r"DISTILLAB_BF16_MATMULS='fp32'; allowed values: auto, native, float32"):
        bf16_matmuls("bf16", "cpu")


def test_arithmetic_names_the_cpu_and_the_bf16_products_a_sweep_records(monkeypatch) -> None:
    """`models.arithmetic` (a sweep's run record, issue 33): the CPU model and, for a bf16 CPU trial,
    native products, float32 ones asked by the variable, or float32 ones for want of native bf16."""
    monkeypatch.setattr(models, "cpu_model", lambda: "Test CPU")
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    monkeypatch.delenv("DISTILLAB_BF16_MATMULS", raising=False)
    assert models.arithmetic() == {"cpu": "Test CPU", "bf16_products": "native"}
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "float32")
    assert models.arithmetic()["bf16_products"] == "float32 (DISTILLAB_BF16_MATMULS=float32)"
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "auto")
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    assert models.arithmetic()["bf16_products"] == "float32 (no native bf16)"


def test_cpu_model_reads_proc_cpuinfo() -> None:
    from pathlib import Path

    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")] \
        if info.exists() else []
    if not names:
        pytest.skip("no 'model name' in /proc/cpuinfo here")
    assert models.cpu_model() == names[0]
