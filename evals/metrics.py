"""Dependent variables of the study that are pure functions of counts or weights
(PROTOCOL.md §4): coverage (pass@k), update sparsity (S_τ) and forgetting.

    >>> round(pass_at_k(n=10, c=3, k=1), 12)
    0.3
    >>> mean_pass_at_k([0, 10], n=10, k=10)
    0.5
"""

from __future__ import annotations

import math
import operator
from typing import Mapping, Sequence

import torch
from torch import Tensor


def _check_count(name: str, value: int) -> int:
    """``value`` as a Python int (numpy/torch integer scalars accepted), >= 0."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k from ``n`` samples of which ``c`` are correct.

        pass@k = 1 − C(n−c, k) / C(n, k)

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv
    2107.03374), eq. 1 — the probability that a uniformly drawn k-subset of the n
    samples holds at least one correct sample. Computed in the numerically stable
    product form of that paper's Figure 3,

        C(n−c, k) / C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i),

    which never forms the (huge) binomial coefficients. It is exactly 1.0 when
    n − c < k (every k-subset contains a correct sample).

    Args:
        n: samples drawn for the prompt, >= 1.
        c: correct samples among them, 0 <= c <= n.
        k: subset size, 1 <= k <= n.

    Returns:
        pass@k in [0, 1] as a Python float.

    Raises:
        TypeError: an argument is not an integer (bools are rejected; numpy and
            torch integer scalars are accepted).
        ValueError: a negative argument, n = 0, k = 0, k > n or c > n; the message
            names the argument.
    """
    n = _check_count("n", n)
    c = _check_count("c", c)
    k = _check_count("k", k)
    if n == 0:
        raise ValueError("n must be >= 1, got 0")
    if k == 0:
        raise ValueError("k must be >= 1, got 0")
    if k > n:
        raise ValueError(f"k must be <= n, got k={k} > n={n}")
    if c > n:
        raise ValueError(f"c must be <= n, got c={c} > n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct_counts: Sequence[int], n: int, k: int) -> float:
    """Mean of :func:`pass_at_k` over prompts, each with ``n`` samples.

    Args:
        correct_counts: correct samples per prompt, one int in [0, n] per prompt.
        n: samples drawn per prompt (the same for every prompt).
        k: subset size, 1 <= k <= n.

    Returns:
        The mean pass@k over prompts as a Python float.

    Raises:
        TypeError, ValueError: ``correct_counts`` is empty (ValueError), or any
            argument is invalid as for :func:`pass_at_k`; the message names it (a
            bad count as ``correct_counts[i]``).
    """
    if len(correct_counts) == 0:
        raise ValueError("correct_counts must be non-empty")
    pass_at_k(n, 0, k)  # validates n and k once
    total = 0.0
    for i, c in enumerate(correct_counts):
        c = _check_count(f"correct_counts[{i}]", c)
        if c > n:
            raise ValueError(f"correct_counts[{i}] must be <= n, got {c} > n={n}")
        total += pass_at_k(n, c, k)
    return total / len(correct_counts)


def parameter_state(module: torch.nn.Module) -> dict[str, Tensor]:
    """The weights S_τ compares (`update_sparsity`): a detached float32 copy of each
    parameter of ``module``, once, under the name ``named_parameters`` gives it.

    A parameter tied under two names (an lm_head tied to the input embeddings, as in
    SmolLM2 and Qwen2.5-1.5B) is one entry, since it is one set of weights: a
    ``state_dict`` lists it under both names, which counted it twice in the overall S_τ and,
    as its gradient hook (`optim.TouchedParameters`) records it under the first name only,
    as never touched under the second. Buffers are not parameters and are left out.

    Returns:
        name → float32 CPU-or-device tensor of the parameter's shape (a copy).
    """
    return {n: p.detach().float().clone() for n, p in module.named_parameters()}


def update_sparsity(
    initial: Mapping[str, Tensor],
    final: Mapping[str, Tensor],
    tau: float,
    *,
    dtype: torch.dtype | None = None,
    masks: Mapping[str, Tensor] | None = None,
) -> tuple[float, dict[str, float]]:
    """Update sparsity S_τ: the fraction of parameters that did not move by τ.

        S_τ = |{ j : |θ_final[j] − θ_init[j]| < τ }| / |θ|

    PROTOCOL.md §4 (the paper reports τ = 1e-6 and 1e-8). ``tau`` here is the
    sparsity threshold on the absolute parameter change — not a softmax
    temperature. The comparison is strict (a change of exactly τ counts as an
    update) and is made in float64 on CPU. With ``dtype`` (e.g. ``torch.bfloat16``,
    the paper's checkpoints) both weights are first rounded to it (round to nearest
    even, as ``Tensor.to`` does; integer tensors are left as they are), so a change
    below the resolution of that dtype counts as no change; without it they are
    compared at their stored values. Non-finite differences (NaN, inf) count as
    updates.

    ``masks`` (name → bool tensor of the parameter's shape) restricts the count to the
    entries where the mask is True, and to the tensors it names: the diagnostic over
    the parameters that ever received a nonzero gradient (`optim.TouchedParameters`).

    Args:
        initial: name → tensor of the weights before training (any shape, any
            floating or integer dtype, any device).
        final: name → tensor after training; the same names and shapes.
        tau: threshold, > 0.
        dtype: the dtype both are rounded to before comparing, or None.
        masks: the entries counted, or None for all.

    Returns:
        ``(overall, per_tensor)``: ``overall`` is over ALL (counted) parameters, i.e.
        each tensor weighted by its (counted) element count; ``per_tensor`` maps each
        name to its own fraction (NaN for a tensor with no counted elements, which adds
        nothing to ``overall``).

    Raises:
        ValueError: ``tau`` <= 0 or not finite; the key sets differ (the message
            names the missing/extra tensors); a tensor's shapes differ (named), or a
            mask's; there are no parameter elements at all to count.
    """
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau (sparsity threshold) must be a finite number > 0, got {tau!r}")
    missing = sorted(set(initial) - set(final))
    extra = sorted(set(final) - set(initial))
    if missing or extra:
        raise ValueError(
            f"state dict keys differ: missing from final: {missing}, not in initial: {extra}"
        )
    per_tensor: dict[str, float] = {}
    unchanged_total = 0
    numel_total = 0
    for name, a in initial.items():
        b = final[name]
        if a.shape != b.shape:
            raise ValueError(
                f"tensor {name!r}: shape mismatch, initial {tuple(a.shape)} vs final {tuple(b.shape)}"
            )
        if masks is not None and name not in masks:
            continue
        keep = None if masks is None else masks[name].detach().to("cpu", torch.bool)
        if keep is not None and keep.shape != a.shape:
            raise ValueError(f"tensor {name!r}: mask shape {tuple(keep.shape)} vs weights {tuple(a.shape)}")
        numel = a.numel() if keep is None else int(keep.sum())
        if numel == 0:
            per_tensor[name] = math.nan
            continue
        diff = (_compared(b, dtype) - _compared(a, dtype)).abs()
        unchanged = int(((diff < tau) if keep is None else ((diff < tau) & keep)).sum().item())
        per_tensor[name] = unchanged / numel
        unchanged_total += unchanged
        numel_total += numel
    if numel_total == 0:
        raise ValueError("no parameter elements to compare (all tensors empty or no tensors)")
    return unchanged_total / numel_total, per_tensor


def _compared(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``t`` on CPU in float64, first rounded to ``dtype`` when it is floating and one is given."""
    t = t.detach().to("cpu")
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t.to(torch.float64)
