"""The chaos driver (scripts/chaos.py, issue 34 item 4, issue 48): its checks on hand-made sweep
folders (fast: a duplicated row, a lost row, a truncated Parquet file, an unequal metric, a trial
the watchdog failed are each found, and two equal folders pass), and a small run of the driver
itself (slow: 4 trials, 3 kills, a Train worker, a Tune trial actor and the driver each SIGKILLed
once, seed 7)."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import polars as pl
import pytest
from _helpers import load_script

from distillab.tables import write_rows

chaos = load_script("scripts/chaos.py")

TRIALS = ("t0", "t1")


def _write_sweep(root: Path, *, loss: float = 0.5, acc: float = 0.25, repeat_metric: bool = False,
                 drop_eval: bool = False, resumed: bool = False) -> Path:
    """A two-trial sweep folder as the recipe writes it: one trials row each, ``loss`` at steps 1-2
    (step 2 written twice, under a second key, with ``repeat_metric``), evals at pre/0 and
    distill/2 (the latter left out for t1 with ``drop_eval``), two samples per eval."""
    for t in TRIALS:
        write_rows(root, "trials", [dict(trial_id=t, status="completed", start_time=1.0, end_time=2.0, seed=1)], key=t)
        rows = [dict(trial_id=t, stage="distill", step=s, name="loss", value=loss * s) for s in (1, 2)]
        if resumed:
            rows.append(dict(trial_id=t, stage="distill", step=2, name="resume/start_step", value=1.0))
        write_rows(root, "metrics", rows, key=f"{t}__distill__steps")
        if repeat_metric and t == "t1":
            write_rows(root, "metrics", rows[1:2], key=f"{t}__distill__again")
        for stage, step in (("pre", 0), ("distill", 2)):
            if drop_eval and t == "t1" and stage == "distill":
                continue
            write_rows(root, "evals", [dict(trial_id=t, stage=stage, step=step, task="countdown3", metric="accuracy",
                                            value=acc if stage == "distill" else 0.0, n=4)], key=f"{t}__{stage}__{step}")
            write_rows(root, "samples", [dict(trial_id=t, stage=stage, step=step, task="countdown3", prompt="p",
                                              completion=c, reward=0.0) for c in "ab"], key=f"{t}__s__{stage}")
    (root / "sweep.json").write_text('{"name": "chaos"}')
    return root


def test_equal_folders_pass(tmp_path: Path) -> None:
    ref = _write_sweep(tmp_path / "ref")
    run = _write_sweep(tmp_path / "run", resumed=True)  # a resumed trial's resume/* metric is not extra
    result = chaos.check_sweep(run, ref)
    assert result["problems"] == []
    assert result["rows"] == {"trials": 2, "metrics": 4, "evals": 4, "samples": 8}
    assert result["equal"] == ["t0", "t1"] and result["unequal"] == []


def test_duplicated_row_found(tmp_path: Path) -> None:
    ref = _write_sweep(tmp_path / "ref")
    run = _write_sweep(tmp_path / "run", repeat_metric=True)
    result = chaos.check_sweep(run, ref)
    assert result["problems"] == ["metrics: 1 duplicated key(s), e.g. [('t1', 'distill', 2, 'loss', 2)]"]
    dup = chaos.duplicated_rows(chaos.load(run).metrics.collect(), chaos.KEYS["metrics"])
    assert dup.rows() == [("t1", "distill", 2, "loss", 2)]


def test_lost_row_found(tmp_path: Path) -> None:
    ref = _write_sweep(tmp_path / "ref")
    run = _write_sweep(tmp_path / "run", drop_eval=True)
    result = chaos.check_sweep(run, ref)
    assert result["problems"][0] == "evals: 1 lost key(s), e.g. [('t1', 'distill', 2, 'countdown3', 'accuracy')]"
    assert result["problems"][1].startswith("samples: 1 (trial, stage, step, task) with another row count")
    assert len(result["problems"]) == 2
    # a trial not completed is not counted equal
    write_rows(run, "trials", [dict(trial_id="t1", status="running", start_time=1.0, end_time=math.nan, seed=1)], key="t1")
    assert chaos.check_sweep(run, ref)["equal"] == ["t0"]
    # the other way round, the same row is extra
    assert chaos.check_sweep(ref, run)["problems"][0].startswith("evals: 1 extra key(s)")


def test_truncated_parquet_found(tmp_path: Path) -> None:
    ref = _write_sweep(tmp_path / "ref")
    run = _write_sweep(tmp_path / "run")
    victim = run / "metrics" / "t0__distill__steps.parquet"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    (run / "tune").mkdir()
    (run / "tune" / "result.json").write_text('{"a": 1}\n{"a": 2}\n')  # JSON lines: fine
    (run / "tune" / "state.json").write_text('{"a": [1, 2')  # truncated JSON
    state = pickle.dumps({"trials": list(range(100))})
    (run / "tune" / "basic-variant-state-1.json").write_bytes(state)  # Tune's pickle named .json: fine
    (run / "tune" / "tuner.pkl").write_bytes(state[:-3])  # a truncated pickle
    (run / "metrics" / ".t1__x.abc.tmp").write_bytes(b"PAR1")  # an interrupted atomic write: counted only
    bad = chaos.corrupt_files(run)
    assert [p for p, _ in bad] == ["metrics/t0__distill__steps.parquet", "tune/state.json", "tune/tuner.pkl"]
    assert chaos.leftover_temporaries(run) == ["metrics/.t1__x.abc.tmp"]
    with pytest.raises(pl.exceptions.ComputeError):  # the tables themselves no longer read either
        chaos.check_sweep(run, ref)


def test_unequal_metric_found(tmp_path: Path) -> None:
    ref = _write_sweep(tmp_path / "ref")
    run = _write_sweep(tmp_path / "run", acc=math.nextafter(0.25, 1.0))  # one ulp off: not bitwise equal
    result = chaos.check_sweep(run, ref)
    assert result["equal"] == [] and result["unequal"] == ["t0", "t1"]
    assert len(result["problems"]) == 2 and "1 eval(s), 0 loss step(s) differ" in result["problems"][0]
    run2 = _write_sweep(tmp_path / "run2", loss=0.5000001)
    assert chaos.check_sweep(run2, ref)["unequal"] == ["t0", "t1"]


def test_nan_equals_nan(tmp_path: Path) -> None:
    ref = _write_sweep(tmp_path / "ref", acc=math.nan)
    run = _write_sweep(tmp_path / "run", acc=math.nan)
    assert chaos.check_sweep(run, ref)["problems"] == []


def test_sweep_command_grid() -> None:
    cmd = chaos.sweep_command(chaos.Chaos(trials=20), Path("/x"))
    assert "search.grid={seed: [1, 2, 3, 4, 5], optimizer.lr: [1.0e-3, 3.0e-3], rollout.policy: [offpd, onpd]}" in cmd
    assert "fault_tolerance.stall_fail_s=1200" in cmd and not any(a.startswith("resources.cpus_per_worker") for a in cmd)
    assert "resources.cpus_per_worker=1.5" in chaos.sweep_command(chaos.Chaos(trials=4, cpus_per_worker=1.5), Path("/x"))
    with pytest.raises(ValueError, match="multiple of 4"):
        chaos.sweep_command(chaos.Chaos(trials=6), Path("/x"))


def test_stalls_found_in_the_log(tmp_path: Path) -> None:
    """`chaos.stalls`: a stall the watchdog said is counted, a trial it failed is a problem."""
    log = tmp_path / "chaos.log"
    said = "[watchdog] no trial reported a step for 130 s; waiting for resources: t1 (...); held: CPU 2 of 2 in use"
    removed = "2026-12-06 08:45:11,458 distillab.driver.watchdog removed {} placement group(s) of dead Train controllers: x"
    log.write_text(f"$ distillab sweep ...\n{said}\n(RayTrainWorker pid=1) [trial] t2 distill step 40: ...\n"
                   f"{removed.format(1)}\n{removed.format(2)}\n")
    assert chaos.stalls(log) == {"said": [said], "failed": [], "removed": 3, "problems": []}
    failed = f"[watchdog] failed trial t1 (distillab sweep --resume /x runs it again): {said}"
    log.write_text(log.read_text() + failed + "\n")
    assert chaos.stalls(log)["problems"] == [f"the watchdog failed a stalled trial: {failed}"]
    assert chaos.stalls(tmp_path / "none.log") == {"said": [], "failed": [], "removed": 0, "problems": []}


@pytest.mark.slow
def test_chaos_small(tmp_path: Path, capsys) -> None:
    """4 trials, one kill of each kind, seed 7 (the seed whose 20-trial run wedged, issue 48): every
    row once, every trial equal to the undisturbed run, no trial failed by the watchdog. (The wedge
    itself, at its smallest: tests/test_faults.py::test_killed_trial_actor_wedge_is_said_failed_and_freed.)"""
    rc = chaos.main(["--trials", "4", "--kills", "3", "--seed", "7", "--pause", "3", "12", "--steps", "20", "--every", "5",
                     "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[chaos] kills: 3 (worker 1, actor 1, driver 1)" in out, out
    assert "unequal: 0" in out and "trials it failed: 0" in out and "[chaos] PASS" in out
