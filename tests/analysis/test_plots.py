"""Figures and the Markdown report from result frames (`distillab.analysis.plots`), the
`distillab report --plots` command, and the analysis notebook executed headless."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import _tolerance as tol
import pytest

from distillab.analysis import plots
from distillab.analysis.results import final_table, load
from distillab.tables import write_rows

#: float64 roundings (tests/_tolerance.py, approx64) of a plotted mean over 3 seeds and its literal
ROUNDINGS = 16

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SKILLS = ("arith", "copy")


def make_sweep(root: Path, *, lam: bool = False, rlvr: bool = False, steps: int = 20, oracle: bool = False) -> Path:
    """A hand-made sweep shaped like `distillab sweep` output: policy × KL × 2 LRs ×
    seeds 42, 43 (with λ ∈ {-1, 0, 1} instead of the policy when ``lam``), pre and
    distill evals, training metrics, optionally an RLVR stage and the oracle's metrics
    every 10 steps (``oracle``); one trial failed."""
    rng = random.Random(0)
    grid = [(p, k, lr, None) for p in ("offpd", "onpd") for k in ("forward", "reverse")
            for lr in (1e-4, 1e-3)]
    if lam:
        grid = [("lambda", k, 1e-3, x) for k in ("forward", "reverse") for x in (-1.0, 0.0, 1.0)]
    for policy, kind, lr, x in grid:
        for seed in (42, 43):
            tid = f"{policy}-{kind}-lr{lr:g}-l{x}-s{seed}".replace("None", "n")
            failed = (policy, kind, lr, seed) == ("onpd", "reverse", 1e-3, 43)
            row = {"trial_id": tid, "status": "failed" if failed else "completed",
                   "error": "RuntimeError: boom" if failed else None, "start_time": 0.0,
                   "end_time": 1.0, "checkpoint": None, "seed": seed, "rollout.policy": policy,
                   "loss.kind": kind, "optimizer.lr": lr, "optimizer.clip": 1.0}
            if lam:
                row["rollout.lambda"] = x
            write_rows(root, "trials", [row], key=tid)
            evals = []
            for stage, step in (("pre", 0), ("distill", steps)) + ((("rlvr", 5),) if rlvr else ()):
                if failed and stage != "pre":
                    continue
                gain = {"pre": 0.0, "distill": 0.3, "rlvr": 0.4}[stage]
                for task in ("countdown3", "countdown4e"):
                    evals += [dict(task=task, metric=m, value=min(1.0, gain + rng.uniform(0, v)), n=8)
                              for m, v in (("accuracy", 0.2), ("pass@1", 0.2), ("pass@10", 0.5))]
                ood = [rng.uniform(0.5, 0.9) - (lr * 100 if stage != "pre" else 0) for _ in SKILLS]
                evals += [dict(task=f"ood/{s}", metric="accuracy", value=v, n=4) for s, v in zip(SKILLS, ood)]
                evals.append(dict(task="ood", metric="ood_mean", value=sum(ood) / len(ood), n=len(SKILLS)))
                if stage == "distill":
                    evals += [dict(task="params", metric=f"sparsity@{t:g}", value=1 - lr * 300 * f, n=12)
                              for t, f in ((1e-6, 1.0), (1e-8, 2.0))]
                    evals += [dict(task=f"params/{name}", metric="sparsity@1e-06", value=1 - lr * 300 * f, n=64)
                              for name, f in (("model.layers.0.mlp.up_proj.weight", 0.5),
                                              ("model.layers.1.mlp.up_proj.weight", 1.5), ("lm_head.weight", 1.0))]
                write_rows(root, "evals", [{**e, "trial_id": tid, "stage": stage, "step": step}
                                           for e in evals], key=f"{tid}__{stage}__{step}")
                evals = []
            if failed:
                continue
            names = ["loss", "grad_norm", "lr", "kl/forward", "kl/reverse"]
            if lam:
                names += ["rollout/student_loglik", "rollout/teacher_loglik"]
            rows = [dict(trial_id=tid, stage="distill", step=s, name=n,
                         value=(x or 0) * (1 if n.startswith("rollout/s") else -1) - 1 + rng.random()
                         if n.startswith("rollout/") else rng.random())
                    for s in range(1, steps + 1) for n in names]
            if oracle:  # estimator/bias ~ 0.1 · (1 + λ), grad_cos ~ 0.9 − 0.1 · seed offset
                values = (("estimator/bias", 0.1 * (1 + (x or 0))), ("estimator/grad_cos", 0.9 - (seed - 42) / 10))
                rows += [dict(trial_id=tid, stage="distill", step=s, name=n, value=v)
                         for s in range(10, steps + 1, 10) for n, v in values]
            write_rows(root, "metrics", rows, key=f"{tid}__distill")
            if rlvr:
                write_rows(root, "metrics", [dict(trial_id=tid, stage="rlvr", step=s, name="rlvr/reward_mean",
                                                  value=s / 5 + rng.random() / 5) for s in range(1, 6)],
                           key=f"{tid}__rlvr")
    return root


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


def test_every_figure_on_a_distillation_sweep(tmp_path: Path) -> None:
    res = load(make_sweep(tmp_path / "sweep"))
    assert plots.swept_columns(res) == ["rollout.policy", "loss.kind", "optimizer.lr"]
    present = {"a_policy_kl", "b_lr", "d_pass_at_k", "g_tensor_sparsity"}
    for stem, draw in plots.FIGURES.items():
        fig = draw(res)
        notes = plots.figure_notes(fig)
        path = plots.save_figure(fig, tmp_path / "figs", stem)
        assert _is_png(path), stem
        if stem in present:
            assert notes == [], (stem, notes)
        else:  # λ and RLVR panels: no data here, and they say so
            assert notes and all("no data" in n for n in notes), (stem, notes)
            texts = [t.get_text() for ax in fig.axes for t in ax.texts]
            assert any(t.startswith("no data") for t in texts)
    # (a) has 3 panels: 4 policy × KL groups, one bar per LR with a legend
    fig = plots.fig_policy_kl(res)
    acc = fig.axes[0]
    assert [t.get_text() for t in acc.get_xticklabels()] == [
        "offpd, forward", "offpd, reverse", "onpd, forward", "onpd, reverse"]
    assert [t.get_text() for t in acc.get_legend().get_texts()] == ["lr=0.0001", "lr=0.001"]
    assert len(acc.patches) == 8
    # (b): x is the LR on a log axis, one line per policy × KL
    ax = plots.fig_lr(res).axes[0]
    assert ax.get_xscale() == "log" and len(ax.get_legend().get_texts()) == 4


def test_lambda_and_rlvr_panels_fill_in(tmp_path: Path) -> None:
    res = load(make_sweep(tmp_path / "lam", lam=True, rlvr=True, oracle=True))
    for stem, draw in plots.FIGURES.items():
        fig = draw(res)
        assert plots.figure_notes(fig) == [], stem
        assert _is_png(plots.save_figure(fig, tmp_path / "figs", stem))
    ax = plots.fig_lambda(res).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "reverse"]
    loglik = plots.fig_loglik(res).axes[0]
    assert len(loglik.get_legend().get_texts()) == 4  # student and teacher × 2 KL directions
    # student log-likelihood rises with λ in the hand-made data
    bars = next(c for c in loglik.containers if c.get_label() == "forward (student)")
    ys = list(bars.lines[0].get_ydata())
    assert ys == sorted(ys)
    rl = plots.fig_rlvr(res)
    assert len(rl.axes[0].get_lines()) == 6  # one reward curve per distilled configuration
    assert [t.get_text() for t in rl.axes[1].get_legend().get_texts()] == ["pre", "distill", "rlvr"]
    table = plots.summary_table(res)
    assert "RLVR gain" in table.columns and table.height == 6
    # (h): one bias and one grad_cos curve per configuration, at the oracle steps, mean over seeds
    est = plots.fig_estimator(res)
    bias, cos = est.axes
    assert len(bias.get_lines()) >= 6 and len(cos.get_legend().get_texts()) == 6
    curve = next(ln for ln in cos.get_lines() if ln.get_label() == "forward, λ=0")
    assert list(curve.get_xdata()) == [10, 20] and list(curve.get_ydata()) == tol.approx64([0.85, 0.85], ROUNDINGS)
    curve = next(ln for ln in bias.get_lines() if ln.get_label() == "reverse, λ=1")
    assert list(curve.get_ydata()) == tol.approx64([0.2, 0.2], ROUNDINGS)
    assert table["estimator/grad_cos"].to_list()[0] == "0.85 ± 0.05"  # seeds 42, 43: 0.9 and 0.8


def test_summary_table_and_report(tmp_path: Path) -> None:
    res = load(make_sweep(tmp_path / "sweep"))
    table = plots.summary_table(res)
    assert table.columns == ["rollout.policy", "loss.kind", "optimizer.lr", "countdown3 acc",
                             "countdown4e acc", "ΔOOD", "countdown4e gain", "sparsity@1e-06",
                             "countdown3 pass@1", "countdown3 pass@10", "n_completed", "n_failed"]
    bad = table.filter((pl.col("rollout.policy") == "onpd") & (pl.col("loss.kind") == "reverse")
                       & (pl.col("optimizer.lr") == 1e-3)).row(0, named=True)
    assert (bad["n_completed"], bad["n_failed"]) == (1, 1)
    assert "±" not in bad["countdown3 acc"]  # one seed: no SEM
    # sparsity = 1 - 300 lr exactly for every seed: SEM 0
    assert table.filter(pl.col("optimizer.lr") == 1e-4)["sparsity@1e-06"].to_list() == ["0.97 ± 0"] * 4

    out = plots.write_report(res, tmp_path / "report")
    assert set(out) == {*plots.FIGURES, "summary"}
    for stem in plots.FIGURES:
        assert _is_png(out[stem])
    text = out["summary"].read_text()
    assert "![a_policy_kl](a_policy_kl.png)" in text and "## Final metrics" in text
    assert "no data" in text
    assert "16 trials: 15 completed, 1 failed" in text


def test_absent_everything_says_no_data(tmp_path: Path) -> None:
    res = load(tmp_path)  # an empty results directory
    for stem, draw in plots.FIGURES.items():
        fig = draw(res)
        assert plots.figure_notes(fig), stem
        assert _is_png(plots.save_figure(fig, tmp_path / "figs", stem))
    assert "0 trials" in plots.summary_markdown(res)


def test_cli_report_plots(tmp_path: Path, capsys) -> None:
    from distillab.driver.cli import main

    root = make_sweep(tmp_path / "micro")
    out = tmp_path / "docs" / "figures"
    assert main(["report", str(root), "--plots", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "n_failed" in printed and str(out / "summary.md") in printed
    for stem in ("a_policy_kl", "b_lr", "c_lambda", "d_pass_at_k"):
        assert _is_png(out / f"{stem}.png")
    assert (out / "summary.md").read_text().startswith("# distillab report")


def test_cli_report_headline_by_default_and_everything_with_full(tmp_path: Path, capsys) -> None:
    """``distillab report`` prints the headline table (one row per configuration: 8 here);
    ``--full`` the long one (a row per configuration × stage × task × metric)."""
    from distillab.driver.cli import main

    root = make_sweep(tmp_path / "micro")
    assert main(["report", str(root)]) == 0
    head = capsys.readouterr().out.splitlines()
    assert head[0].startswith("| rollout.policy | loss.kind | optimizer.lr | countdown3 acc | countdown4e acc | ΔOOD")
    assert len(head) == 2 + 8  # header, rule, 2 policies × 2 KL × 2 LRs
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in head[2:]]
    failed = [c for c in cells if c[:3] == ["onpd", "reverse", "0.001"]]
    assert len(failed) == 1 and failed[0][-2:] == ["1", "1"]  # 1 completed, 1 failed
    assert main(["report", str(root), "--full"]) == 0
    full = capsys.readouterr().out.splitlines()
    assert "| stage " in full[0] and "| task " in full[0] and "| metric " in full[0] and "mean ± sem" in full[0]
    assert len(full) - 2 == final_table(load(root), ["rollout.policy", "loss.kind", "optimizer.lr",
                                                     "optimizer.clip"]).height > 100


def test_notebook_is_stored_without_outputs() -> None:
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    params = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1 and "RESULTS = " in "".join(params[0]["source"])
    source = "".join("".join(c["source"]) for c in code)
    assert "DISTILLAB_RESULTS" in source and "DISTILLAB_FIGURES" in source
    assert "plots.FIGURES" in source  # the same figure functions as `distillab report --plots`


def _run_notebook(results: Path, figures: Path, tmp_path: Path, monkeypatch) -> None:
    import nbclient
    import nbformat

    monkeypatch.setenv("DISTILLAB_RESULTS", str(results))
    monkeypatch.setenv("DISTILLAB_FIGURES", str(figures))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()


@pytest.mark.slow
def test_notebook_executes_on_a_real_sweep(smoke_sweep: Path, tmp_path: Path, monkeypatch) -> None:
    figures = tmp_path / "figures"
    _run_notebook(smoke_sweep, figures, tmp_path, monkeypatch)
    saved = sorted(figures.glob("*.png"))
    assert [p.stem for p in saved] == sorted(plots.FIGURES)
    for path in saved:
        assert _is_png(path), path
    res = load(smoke_sweep)
    assert res.trials.collect()["status"].to_list() == ["completed"] * 2
    # the real schema feeds figures (a), (b), (d) completely; the report CLI writes them
    for stem in ("a_policy_kl", "b_lr", "d_pass_at_k"):
        assert plots.figure_notes(plots.FIGURES[stem](res)) == [], stem
    from distillab.driver.cli import main

    assert main(["report", str(smoke_sweep), "--plots", str(tmp_path / "report")]) == 0
    for stem in ("a_policy_kl", "b_lr", "c_lambda", "d_pass_at_k"):
        assert _is_png(tmp_path / "report" / f"{stem}.png")
    assert "2 trials: 2 completed" in (tmp_path / "report" / "summary.md").read_text()
