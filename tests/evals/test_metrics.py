"""pass@k against hand-computed closed forms and brute-force subset enumeration;
update sparsity on hand-made state dicts (PROTOCOL.md §4)."""

from __future__ import annotations

import itertools
import math

import _tolerance as tol
import pytest
import torch

from distillab.evals.metrics import mean_pass_at_k, pass_at_k, update_sparsity

#: float64 roundings (tests/_tolerance.py, approx64) of pass@k: a product of up to c <= 1000 factors
#: (1 − k/i), two roundings each
ROUNDINGS = 2048


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),  # pass@1 = c / n
        (10, 3, 10, 1.0),  # every 10-subset holds a correct sample
        (10, 0, 1, 0.0),
        (10, 0, 10, 0.0),
        (10, 10, 1, 1.0),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 0.7
        (10, 3, 2, 1 - 21 / 45),  # 1 - C(7,2)/C(10,2)
        (10, 1, 5, 0.5),  # 1 - C(9,5)/C(10,5) = 1 - 126/252
    ],
)
def test_pass_at_k_closed_form(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == tol.approx64(expected, ROUNDINGS)


def test_pass_at_k_brute_force_subsets() -> None:
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == tol.approx64(brute, ROUNDINGS), (n, c, k)
                assert pass_at_k(n, c, k) == tol.approx64(1 - math.comb(n - c, k) / math.comb(n, k), ROUNDINGS)


def test_pass_at_k_large_n_is_stable() -> None:
    # C(1000, 500) overflows float; the product form does not.
    assert pass_at_k(1000, 1, 500) == tol.approx64(0.5, ROUNDINGS)
    assert 0.0 <= pass_at_k(2000, 7, 100) <= 1.0


@pytest.mark.parametrize(
    ("n", "c", "k", "name"),
    [(10, 3, 11, "k"), (10, 11, 1, "c"), (-1, 0, 1, "n"), (10, -1, 1, "c"), (10, 3, -2, "k"),
     (10, 3, 0, "k"), (0, 0, 0, "n")],
)
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        pass_at_k(n, c, k)


def test_pass_at_k_type_errors() -> None:
    with pytest.raises(TypeError, match="k"):
        pass_at_k(10, 3, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="c"):
        pass_at_k(10, True, 1)
    assert pass_at_k(10, torch.tensor(3), 1) == tol.approx64(0.3, ROUNDINGS)


def test_mean_pass_at_k() -> None:
    assert mean_pass_at_k([0, 10], n=10, k=10) == 0.5
    assert mean_pass_at_k([3, 1], n=10, k=1) == tol.approx64((0.3 + 0.1) / 2, ROUNDINGS)
    with pytest.raises(ValueError, match="non-empty"):
        mean_pass_at_k([], n=10, k=1)
    with pytest.raises(ValueError, match=r"correct_counts\[1\]"):
        mean_pass_at_k([3, 11], n=10, k=1)
    with pytest.raises(ValueError, match=r"^k\b"):
        mean_pass_at_k([3], n=10, k=11)


def _state_pair() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """10 parameters: 3 changed by 1e-3 (> τ for both τ), one by 5e-7 (= τ/2 at
    τ = 1e-6, so unchanged there but changed at τ = 1e-8) and one by 5e-9 (= τ/2 at
    τ = 1e-8: unchanged at both)."""
    a0 = torch.zeros(2, 3, dtype=torch.float64)
    b0 = torch.arange(4, dtype=torch.float32) * 0  # float32 zeros: 5e-9 is representable
    a1, b1 = a0.clone(), b0.clone()
    a1[0, 0] += 1e-3
    a1[1, 2] += 5e-7
    b1[0] += 1e-3
    b1[1] -= 1e-3
    b1[2] += 5e-9
    return {"a": a0, "b": b0}, {"a": a1, "b": b1}


def test_update_sparsity_tau_1e6() -> None:
    initial, final = _state_pair()
    overall, per = update_sparsity(initial, final, tau=1e-6)
    assert per == {"a": 5 / 6, "b": 2 / 4}
    assert overall == 7 / 10


def test_update_sparsity_tau_1e8() -> None:
    initial, final = _state_pair()
    overall, per = update_sparsity(initial, final, tau=1e-8)
    assert per == {"a": 4 / 6, "b": 2 / 4}
    assert overall == 6 / 10


def test_update_sparsity_boundary_and_dtypes() -> None:
    # A change of exactly τ is an update (strict <); bf16 weights compare at stored values.
    init = {"w": torch.zeros(4, dtype=torch.float64), "h": torch.ones(2, dtype=torch.bfloat16)}
    fin = {"w": torch.tensor([2.0**-20, 0, 0, 0], dtype=torch.float64), "h": init["h"].clone()}
    overall, per = update_sparsity(init, fin, tau=2.0**-20)
    assert per == {"w": 3 / 4, "h": 1.0}
    assert overall == 5 / 6


def test_update_sparsity_errors() -> None:
    initial, final = _state_pair()
    with pytest.raises(ValueError, match="tau"):
        update_sparsity(initial, final, tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        update_sparsity(initial, final, tau=-1e-6)
    with pytest.raises(ValueError, match="'b'"):
        update_sparsity(initial, {"a": final["a"]}, tau=1e-6)
    with pytest.raises(ValueError, match="'c'"):
        update_sparsity(initial, {**final, "c": torch.zeros(1)}, tau=1e-6)
    with pytest.raises(ValueError, match="'a'.*shape"):
        update_sparsity(initial, {**final, "a": torch.zeros(3, 2)}, tau=1e-6)


def test_update_sparsity_rounded_to_bf16() -> None:
    """Compared in bf16 (the paper's checkpoints), a change below half a bf16 step is no
    change. bf16 steps: 2^-7 = 0.0078125 in [1, 2), 2^-6 in [2, 4), 2^-8 below 1.
    - 1.0 → 1.001: 1.001 rounds to 1.0 (0.001 < 2^-8): unchanged in bf16, changed in fp32;
    - 1.0 → 1.005: rounds to 1.0078125: changed in both;
    - 1.001 → 1.003: both round to 1.0: unchanged in bf16 (both moved off the bf16 grid);
    - 3.0 → 2.99: rounds to 2.984375 (0.0056 away; 3.0 is 0.01 away): changed in both;
    - 0.5 → 0.5: unchanged in both;
    - 0.999 → 0.998: 0.999 → 1.0, 0.998 → 0.99609375 (0.0019 < 0.002): changed in both
      though the change is 1e-3 (the bf16 grid, not the size of the change, decides)."""
    init = {"w": torch.tensor([1.0, 1.0, 1.001, 3.0, 0.5, 0.999])}
    fin = {"w": torch.tensor([1.001, 1.005, 1.003, 2.99, 0.5, 0.998])}
    s_fp32, _ = update_sparsity(init, fin, tau=1e-6)
    s_bf16, per = update_sparsity(init, fin, tau=1e-6, dtype=torch.bfloat16)
    assert s_fp32 == 1 / 6  # only 0.5
    assert s_bf16 == per["w"] == 3 / 6  # 1.0 → 1.001, 1.001 → 1.003 and 0.5
    s_32, _ = update_sparsity(init, fin, tau=1e-6, dtype=torch.float32)
    assert s_32 == s_fp32  # float32 weights rounded to float32: their stored values
    # bf16 weights are already on the grid: rounding them to bf16 changes nothing
    init_bf = {"w": init["w"].to(torch.bfloat16)}
    fin_bf = {"w": fin["w"].to(torch.bfloat16)}
    assert update_sparsity(init_bf, fin_bf, tau=1e-6) == update_sparsity(init_bf, fin_bf, 1e-6, dtype=torch.bfloat16)
    assert update_sparsity(init_bf, fin_bf, tau=1e-6)[0] == 3 / 6


def test_update_sparsity_over_masked_entries() -> None:
    """``masks`` counts only the entries it marks, and only the tensors it names: of the
    state pair's 10 parameters, mark a[0, 0] (changed), a[0, 1] (unchanged), a[1, 2]
    (5e-7: unchanged at τ = 1e-6) and none of b's: S = 2/3 over a's 3 marked entries,
    b NaN (no marked entry); a tensor left out of ``masks`` is skipped."""
    initial, final = _state_pair()
    mask_a = torch.zeros(2, 3, dtype=torch.bool)
    mask_a[0, 0] = mask_a[0, 1] = mask_a[1, 2] = True
    overall, per = update_sparsity(initial, final, 1e-6, masks={"a": mask_a, "b": torch.zeros(4, dtype=torch.bool)})
    assert overall == 2 / 3 and per["a"] == 2 / 3 and math.isnan(per["b"])
    overall, per = update_sparsity(initial, final, 1e-8, masks={"a": mask_a})
    assert overall == 1 / 3 and set(per) == {"a"}  # at τ = 1e-8 the 5e-7 change counts
    with pytest.raises(ValueError, match="'a'.*mask shape"):
        update_sparsity(initial, final, 1e-6, masks={"a": torch.ones(6, dtype=torch.bool)})
    with pytest.raises(ValueError, match="no parameter elements"):
        update_sparsity(initial, final, 1e-6, masks={"b": torch.zeros(4, dtype=torch.bool)})
