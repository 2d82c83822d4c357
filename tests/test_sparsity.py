"""Update sparsity in the paper's sense (issue 17): the gradient masks of
`optim.TouchedParameters` on a hand-made module, the rows `evals.suite.sparsity_rows`
writes from hand-made weights, and those rows in a real trial's final report."""

from __future__ import annotations

import math

import _tolerance as tol
import pytest
import torch

from distillab.config import EvaluationConfig, RuntimeContext, TrialConfig
from distillab.recipe.distill import run_worker
from distillab.recipe.session import LocalSession
from distillab.evals.metrics import parameter_state
from distillab.evals.suite import sparsity_rows
from distillab.recipe.optim import TouchedParameters
from distillab.registry import check_report_metric, eval_key
from _helpers import one_gloo_rank
from fixtures.record_golden import golden_models, golden_trial


@pytest.fixture(scope="module")
def one_rank():
    yield from one_gloo_rank()


@pytest.fixture(scope="module")
def golden_fp32_report(one_rank, tmp_path_factory):
    """The final report of 4 steps of the golden OffPD forward-KL trial (float32)."""
    root = tmp_path_factory.mktemp("sparsity_trial")
    teacher, student = golden_models(root / "models")
    trial = golden_trial("offpd", "forward")
    trial["optimizer"]["steps"] = 4
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(root),
                         shared_cache=str(root / "shared"))
    return run_worker(TrialConfig.model_validate(trial), ctx, "sparsity", LocalSession())


class _Lookup(torch.nn.Module):
    """An embedding of 5 rows × 2 and a scale whose second entry multiplies nothing."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(5, 2)
        self.scale = torch.nn.Parameter(torch.ones(2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.emb(ids) * self.scale * torch.tensor([1.0, 0.0])).sum()


def test_touched_masks_mark_entries_with_a_nonzero_gradient() -> None:
    """Rows 0 and 2 are looked up in the first backward, row 4 in the second: those rows'
    first column has a nonzero gradient, their second (×0) and rows 1, 3 never do; of
    ``scale`` only entry 0. The masks are the union over backwards, and a resumed tracker
    starts from the masks it is given."""
    torch.manual_seed(0)
    m = _Lookup()
    t = TouchedParameters(m)
    m(torch.tensor([0, 2])).backward()
    m(torch.tensor([4])).backward()
    got = t.gathered()
    want_emb = torch.zeros(5, 2, dtype=torch.bool)
    want_emb[[0, 2, 4], 0] = True
    assert torch.equal(got["emb.weight"], want_emb)
    assert got["scale"].tolist() == [True, False]
    t.remove()
    m(torch.tensor([1])).backward()  # after remove: not tracked
    assert torch.equal(t.gathered()["emb.weight"], want_emb)
    resumed = TouchedParameters(m, masks=got)
    m(torch.tensor([3])).backward()
    want_emb[3, 0] = True
    assert torch.equal(resumed.gathered()["emb.weight"], want_emb)
    resumed.remove()


def test_sparsity_rows_with_touched_masks() -> None:
    """Hand-made weights, 8 entries: ``a`` (4) moved 1.0 → 1.001 at entry 0 (below half a
    bf16 step: no change in bf16) and → 1.5 at entry 1; ``b`` (4) never had a gradient
    and did not move. In bf16: S = 7/8 over all; over the touched entries (a[0], a[1]) 1/2;
    touched share 2/8. In fp32: S = 6/8, touched 0/2."""
    init = {"a": torch.ones(4), "b": torch.zeros(4)}
    fin = {"a": torch.tensor([1.001, 1.5, 1.0, 1.0]), "b": torch.zeros(4)}
    touched = {"a": torch.tensor([True, True, False, False]), "b": torch.zeros(4, dtype=torch.bool)}
    rows = {(r["task"], r["metric"]): (r["value"], r["n"])
            for r in sparsity_rows(init, fin, (1e-6,), torch.bfloat16, touched)}
    assert rows[("params", "sparsity@1e-06")] == (7 / 8, 2)
    assert rows[("params/a", "sparsity@1e-06")] == (3 / 4, 4)
    assert rows[("params", "touched_share")] == (2 / 8, 8)
    assert rows[("params", "sparsity_touched@1e-06")] == (1 / 2, 2)
    rows = {(r["task"], r["metric"]): r["value"] for r in sparsity_rows(init, fin, (1e-6,), None, touched)}
    assert rows[("params", "sparsity@1e-06")] == 6 / 8 and rows[("params", "sparsity_touched@1e-06")] == 0.0
    nothing = {k: torch.zeros(4, dtype=torch.bool) for k in init}  # no entry touched: no sparsity_touched row
    rows = {(r["task"], r["metric"]): r["value"] for r in sparsity_rows(init, fin, (1e-6,), None, nothing)}
    assert rows[("params", "touched_share")] == 0.0 and ("params", "sparsity_touched@1e-06") not in rows


class _Tied(torch.nn.Module):
    """An embedding of 3 rows × 2 whose weight is also the output layer's (a tied lm_head), and a bias of 3."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(3, 2)
        self.head = torch.nn.Linear(2, 3)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)).logsumexp(-1).sum()


def test_a_tied_weight_counts_once() -> None:
    """A tied weight is one set of 6 entries: `parameter_state` lists it once (``state_dict`` twice),
    so after one backward that touches every entry (the output layer's gradient reaches all 3 rows)
    the touched share is 9/9, not the (6 + 3)/15 a state_dict would give, and after moving only
    the tied weight S_τ is 3/9 (the bias), not 3/15."""
    torch.manual_seed(0)
    m = _Tied()
    assert list(m.state_dict()) == ["emb.weight", "head.weight", "head.bias"]
    init = parameter_state(m)
    assert list(init) == ["emb.weight", "head.bias"]
    t = TouchedParameters(m)
    m(torch.tensor([0, 1, 2])).backward()
    with torch.no_grad():
        m.emb.weight += 1.0
    rows = {(r["task"], r["metric"]): r["value"]
            for r in sparsity_rows(init, parameter_state(m), (1e-6,), None, t.gathered())}
    t.remove()
    assert rows[("params", "touched_share")] == 1.0
    assert rows[("params", "sparsity@1e-06")] == 3 / 9
    assert init["emb.weight"].data_ptr() != m.emb.weight.data_ptr()  # a copy, not the live weight


def test_touched_metric_names_are_registered() -> None:
    for metric in ("sparsity_touched@1e-06", "sparsity_touched@1e-08", "touched_share"):
        check_report_metric(eval_key("distill", "params", metric), "search.metric")


def test_sparsity_dtype_defaults_to_bf16_and_names_its_values() -> None:
    assert EvaluationConfig().sparsity_dtype == "bf16" and EvaluationConfig().sparsity_touched
    with pytest.raises(ValueError, match="sparsity_dtype"):
        EvaluationConfig(sparsity_dtype="fp16")


def test_trial_reports_touched_sparsity(golden_fp32_report) -> None:
    """The golden micro trial (20 steps; tests/test_golden.py's models): the character
    embedding rows of tokens no prompt or completion uses get no gradient, so fewer than
    all entries are touched; S over the touched entries is at most S over all (the
    untouched ones never move) and below 1."""
    final = golden_fp32_report
    share = final["eval/distill/params/touched_share"]
    assert 0.5 < share < 1
    s_all, s_touched = final["eval/distill/params/sparsity@1e-06"], final["eval/distill/params/sparsity_touched@1e-06"]
    assert s_touched <= s_all < 1 and not math.isnan(s_touched)
    # the untouched entries are unchanged: S_all = share · S_touched + (1 − share)
    # each a count over a count (float64), then a product and a sum: 8 roundings (tests/_tolerance.py)
    assert s_all == tol.approx64(share * s_touched + (1 - share), 8)
