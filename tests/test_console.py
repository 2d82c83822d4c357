"""What a sweep prints and what its trackers log (issue 14), on real smoke sweeps
through the command line:

- the session's ``smoke_sweep`` (tests/conftest.py: ``distillab sweep
  search_spaces/smoke.yaml --no-dashboard``, 2 trials) prints at most 60 lines: the
  Tune progress table, one line per finished stage of each trial, the closing
  tables, and none of Ray's known-harmless lines;
- a trial that fails still prints its traceback, and the sweep exits 1;
- with the ``tracking`` extra installed, a smoke sweep's W&B (offline) and MLflow
  (SQLite under the run folder) runs, read back, hold every trial's config and its
  final Countdown-3 accuracy, equal to the ``evals`` table's.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import _tolerance as tol
import pytest

from distillab.driver.environ import HARMLESS_RAY_LINES
from distillab.config import load_sweep
from distillab.models import build_char_tokenizer, micro_llama_config

#: float64 roundings (tests/_tolerance.py, approx64): a metric stored, read back and handed on
ROUNDINGS = 4

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
ACC = "eval/distill/countdown3/accuracy"


def _final_accuracy(root: Path, task: str = "countdown3", metric: str = "accuracy") -> dict[str, float]:
    """trial id → its Countdown-3 accuracy (or ``task``'s ``metric``) after distillation,
    from the ``evals`` table."""
    from distillab.analysis.results import load

    ev = load(root).evals.filter((pl.col("stage") == "distill") & (pl.col("task") == task)
                                 & (pl.col("metric") == metric)).collect()
    return dict(zip(ev["trial_id"], ev["value"]))


def _wandb_run(path: Path) -> dict:
    """What an offline W&B run file (``run-<id>.wandb``) holds: ``name``, ``config``,
    ``history`` (one dict per logged row) and ``summary``. The file is W&B's record log
    (LevelDB's log format: 32 KiB blocks of chunks with a 7-byte header, after a 7-byte
    file header ``:W&B`` 0xBEE1 0) of ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    out = {"name": None, "config": {}, "history": [], "summary": {}}

    def items(entries) -> dict:
        return {e.key or "/".join(e.nested_key): json.loads(e.value_json) for e in entries}

    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if (length, kind) == (0, 0):
            pos += block - pos % block
            continue
        buf = (b"" if kind in (1, 2) else buf) + data[pos + 7:pos + 7 + length]  # 1 full, 2 first, 3 middle, 4 last
        pos += 7 + length
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            which = r.WhichOneof("record_type")
            if which == "run":
                out["name"] = r.run.display_name
                out["config"].update(items(r.run.config.update))
            elif which == "config":
                out["config"].update(items(r.config.update))
            elif which == "history":
                out["history"].append(items(r.history.item))
            elif which == "summary":
                out["summary"].update(items(r.summary.update))
    return out


@pytest.mark.slow
def test_a_smoke_sweep_prints_a_calm_console(smoke_sweep: Path) -> None:
    lines = (smoke_sweep.parent / "console.txt").read_text().splitlines()
    text = "\n".join(lines)
    assert len(lines) <= 60, text
    assert "\x1b[" not in text, text  # written to a pipe: Ray's worker prefixes come without colour codes
    trials = sorted(_final_accuracy(smoke_sweep))
    assert len(trials) == 2
    for tid in trials:  # one line per finished stage of each trial, and the progress table names the trials
        assert len([x for x in lines if f"[trial] {tid} pre step 0:" in x]) == 1, text
        assert len([x for x in lines if f"[trial] {tid} distill step 4:" in x]) == 1, text
        assert any(x.startswith("|") and tid in x for x in lines), text
    assert "== Status ==" in text and "[sweep] 2 of 2 trials completed" in text
    # every stage line before the sweep's end (Ray's log deduplicator had held one back: see below)
    end = next(i for i, x in enumerate(lines) if "[sweep] 2 of 2 trials completed" in x)
    assert max(i for i, x in enumerate(lines) if "[trial] " in x) < end, text
    assert any(x.startswith("| rollout.policy") and "countdown3 acc" in x for x in lines)  # the headline table
    for harmless in (*HARMLESS_RAY_LINES, "Summary name", "Loading weights", "Writing model shards",
                     "Setting accelerator to CPU", "Token authentication is enabled", "Distutils was imported"):
        assert not re.search(harmless, text), harmless


def test_every_trials_stage_line_is_printed_when_it_arrives() -> None:
    """Ray's log deduplicator (the driver's, on forwarded worker lines) keys a line on its
    words without digits, so the stage lines of three trials (three processes) look alike:
    by default it prints the first and holds the others for its 5 s window, then prints one
    "[repeated 2x across cluster]" line for both; under the CLI's ``RAY_DEDUP_LOGS_ALLOW_REGEX``
    (`environ.NEVER_DEDUPLICATED_LINES`) each is printed as it arrives. Ray's own class, fake clock."""
    from ray._private.ray_logging import LogDeduplicator

    from distillab.driver.environ import NEVER_DEDUPLICATED_LINES, any_of

    allow = any_of(NEVER_DEDUPLICATED_LINES)
    line = "[trial] offpd-forward-lr0.001-s{s}-0a1b2c3{s} distill step 4: countdown3 acc 0.0{s}0 (eval 0.{s} s)"
    for allow_re, printed_at_once in ((None, 1), (allow, 3)):
        now = [0.0]
        dedup = LogDeduplicator(5, allow_re, None, _timesource=lambda: now[0])
        out = []
        for s in (1, 2, 3):
            now[0] += 0.5
            batch = {"ip": "192.0.2.2", "pid": 100 + s, "is_err": True, "lines": [line.format(s=s)]}
            out += [x for b in dedup.deduplicate(batch) for x in b["lines"]]
        assert out == [line.format(s=s) for s in (1, 2, 3)][:printed_at_once]
        if allow_re is None:
            now[0] += 5.0  # the window closes with the next batch: two of the three lines become one
            late = [x for b in dedup.deduplicate({"ip": "192.0.2.2", "pid": 9, "is_err": True, "lines": []})
                    for x in b["lines"]]
            assert len(late) == 1 and "[repeated 2x across cluster]" in late[0] and "s3-" in late[0]
    assert re.search(allow, line.format(s=1)) and not re.search(allow, "(raylet) trial start")


def test_a_trial_actor_drops_only_sigterm_exits_python_cannot_raise(monkeypatch) -> None:
    """Ray's SIGTERM handler raises SystemExit; inside a weakref callback Python cannot raise
    it and prints "Exception ignored in: ..." (the ending trial actor). The trial actor's hook
    drops that and passes every other unraisable exception on; ``--verbose`` keeps them all."""
    from distillab.driver.sweep import drop_unraisable_sigterm_exits, train_settings

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value)))
    drop_unraisable_sigterm_exits()

    class Raises:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    Raises(SystemExit(1))  # destroyed at once: its __del__'s exception is "unraisable"
    Raises(ValueError("a real fault"))
    assert seen == [ValueError]
    hook = sys.unraisablehook
    drop_unraisable_sigterm_exits()  # a reused trial actor runs it again: one hook, not a chain
    assert sys.unraisablehook is hook
    monkeypatch.setattr("ray.nodes", lambda: [{"Alive": True}])
    assert train_settings(1)["quiet_exit"] is True and train_settings(2)["quiet_exit"] is False


@pytest.mark.slow
def test_a_failed_trial_prints_its_traceback(tmp_path: Path) -> None:
    """The student path of a trial is a checkpoint directory whose config and tokenizer
    pass the sweep's own checks (`plan.check_checkpoints`) but whose weights file is not
    safetensors: its Train worker fails at set-up, and the console shows the traceback
    and the error."""
    broken = tmp_path / "broken-model"
    tok = build_char_tokenizer()
    s = load_sweep(SMOKE, {}).models.micro_student
    micro_llama_config(len(tok), s.hidden_size, s.num_layers, s.num_heads, s.intermediate_size,
                       s.max_position_embeddings, tok).save_pretrained(broken)
    tok.save_pretrained(broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    sets = {"storage_path": tmp_path, "models.cache_dir": REPO / ".cache" / "models", "models.student_path": broken,
            "search.grid": "{rollout.policy: [onpd]}", "fault_tolerance.trial_retries": 0,
            "fault_tolerance.worker_restarts": 0}
    cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(SMOKE), "--no-dashboard"]
    proc = subprocess.run([*cmd, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback (most recent call last)" in out, out[-3000:]
    # the worker's own traceback (where it failed: loading the student's weights) and Tune's
    assert "Error in training function" in out and "in setup_models" in out and "load_model" in out, out[-3000:]
    assert "Trial task failed for trial onpd-forward" in out and "WorkerGroupError" in out, out[-3000:]
    assert "[sweep] 0 of 1 trials completed, 1 failed\n" in out and "distillab sweep --resume" in out


@pytest.mark.slow
def test_an_interrupted_sweep_offers_one_way_to_resume(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) once a trial runs: the sweep exits 1, counts its unfinished trials and
    names ``distillab sweep --resume``, not Tune's ``Tuner.restore``."""
    import signal

    cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(SMOKE), "--no-dashboard",
           "--set", f"storage_path={tmp_path}", "--set", f"models.cache_dir={REPO / '.cache' / 'models'}",
           "--set", "resources.local_mode=true"]  # one process per trial: lean for CI (the driver is what is tested)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # until the first trial has evaluated its untrained student
        lines.append(line)
        if "[trial] " in line and " pre step 0:" in line:
            proc.send_signal(signal.SIGINT)
            break
    out = "".join(lines) + proc.communicate(timeout=600)[0]
    assert proc.returncode == 1, out[-3000:]
    done, failed, unfinished = map(int, re.search(
        r"\[sweep\] (\d) of 2 trials completed, (\d) failed, (\d) unfinished\n", out).groups())
    assert failed == 0 and unfinished >= 1 and done + unfinished == 2, out[-3000:]
    assert f"[sweep] incomplete; continue with: distillab sweep --resume {tmp_path / 'smoke'}" in out
    assert "Tuner.restore" not in out, out[-3000:]


@pytest.mark.slow
def test_trackers_hold_every_trials_config_and_accuracy(run_locally, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    from distillab.analysis.results import load

    sweep = load_sweep(SMOKE, {"storage_path": str(tmp_path), "models.cache_dir": str(REPO / ".cache" / "models"),
                               "trial.optimizer.steps": 4, "tracking": {"wandb": {"mode": "offline"}, "mlflow": {}},
                               "resources.local_mode": True})  # one process per trial: lean for CI
    smoke_sweep = run_locally(sweep)
    trials = load(smoke_sweep).trials.collect()
    policy = dict(zip(trials["trial_id"], trials["rollout.policy"]))
    acc = _final_accuracy(smoke_sweep)
    # the smoke students answer nothing right (accuracy 0); S_τ differs between the trials
    sparsity = _final_accuracy(smoke_sweep, "params", "sparsity@1e-06")
    assert len(acc) == 2 and len(set(sparsity.values())) == 2

    # W&B, offline: one run per trial (its .wandb record file), named by the trial id, with its config,
    # its history (a row per report) and its summary (the last value of each key)
    runs = sorted((smoke_sweep / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2, runs
    seen, configs = {}, {}
    for path in runs:
        run = _wandb_run(path)
        tid = run["name"]
        assert run["config"]["rollout.policy"] == policy[tid] and run["config"]["optimizer.lr"] == 1e-3
        assert run["config"]["loss.kind"] == "forward" and run["config"]["seed"] == 42
        # distillab's trial id, not Tune's, and none of the keys Tune adds to a report
        assert run["config"]["trial_id"] == tid
        assert not {"hostname", "pid", "node_ip", "experiment_tag", "date"} & (set(run["config"]) | set(run["summary"]))
        assert run["summary"][ACC] == tol.approx64(acc[tid], ROUNDINGS) and run["summary"]["step"] == 4
        configs[tid] = set(run["config"]) - {"_wandb", "trial_log_path"}  # W&B's own; Ray's: the trial's Tune folder
        assert run["summary"]["eval/distill/params/sparsity@1e-06"] == tol.approx64(sparsity[tid], ROUNDINGS)
        assert [h["step"] for h in run["history"]] == [4, 4]  # the last step's report, then the final one
        seen[tid] = path
    assert sorted(seen) == sorted(acc)

    # MLflow, SQLite under the run folder: one run per trial named by its id, config as parameters
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{smoke_sweep / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    found = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in found) == sorted(acc)
    for r in found:
        tid = r.info.run_name
        assert r.data.params["trial_id"] == tid and r.data.params["rollout.policy"] == policy[tid]
        # both trackers hold the trial's config and nothing else
        assert set(r.data.params) == configs[tid], set(r.data.params) ^ configs[tid]
        assert r.data.metrics[ACC] == tol.approx64(acc[tid], ROUNDINGS)
        assert r.data.metrics["eval/distill/params/sparsity_at_1e-06"] == tol.approx64(sparsity[tid], ROUNDINGS)  # '@' → '_at_'
        assert "eval/distill/countdown3/pass_at_1" in r.data.metrics and "pid" not in r.data.metrics
        history = client.get_metric_history(r.info.run_id, "loss")
        assert {m.step for m in history} == {4}  # the reports of the last step, at its optimizer step
        assert r.info.status == "FINISHED"


def test_harmless_ray_lines_are_dropped_and_faults_kept() -> None:
    """Ray's log deduplicator under the CLI's ``RAY_DEDUP_LOGS_SKIP_REGEX`` (`environ.HARMLESS_RAY_LINES`)
    drops each known-harmless line as Ray forwards it, and keeps lines that signal a fault."""
    from ray._private.ray_logging import LogDeduplicator

    from distillab.driver.environ import any_of

    dedup = LogDeduplicator(5, None, any_of(HARMLESS_RAY_LINES), _timesource=lambda: 0.0)
    harmless = ["[mutex.cc : 452] RAW: Lock blocking 0x5632c593f900 @",
                "(raylet) 12 PYTHON worker processes have been started on node: 0a1b with address: 192.0.2.2."]
    faults = ["Traceback (most recent call last):", "RuntimeError: the mutex lock failed",
              "(raylet) A worker died or was killed while executing a task by an unexpected system error."]
    for i, line in enumerate(harmless + faults):
        batch = {"ip": "192.0.2.2", "pid": 100 + i, "is_err": True, "lines": [line]}
        out = [x for b in dedup.deduplicate(batch) for x in b["lines"]]
        assert out == ([] if line in harmless else [line]), line


def test_the_driver_console_drops_tunes_resume_hint_and_optunas_notes(caplog) -> None:
    """Below ``--verbose`` the sweep prints its own ``distillab sweep --resume`` line, so Tune's
    ``Tuner.restore`` hint is dropped from its warning (the rest of Tune's log is kept) and
    Optuna logs warnings only."""
    import logging

    import optuna

    from distillab.driver.sweep import TUNE_RESUME_HINT, driver_console

    before = optuna.logging.get_verbosity()
    try:
        driver_console(2)  # --verbose: nothing changes
        assert optuna.logging.get_verbosity() == before
        driver_console(1)
        driver_console(1)  # once per process: one filter
        tune_log = logging.getLogger("ray.tune.tune")
        assert len([f for f in tune_log.filters if getattr(f, "distillab_hint", False)]) == 1
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING
        with caplog.at_level(logging.WARNING, logger="ray.tune.tune"):
            tune_log.warning("Experiment has been interrupted, but the most recent state was saved.\n"
                             f"{TUNE_RESUME_HINT} Tuner.restore(path=...)")
            tune_log.warning("Trial onpd failed")
        assert [r.getMessage() for r in caplog.records] == ["Trial onpd failed"]
    finally:
        optuna.logging.set_verbosity(before)
        tune_log.filters = [f for f in tune_log.filters if not getattr(f, "distillab_hint", False)]


def test_a_sweep_says_which_of_its_trials_ran_before(tmp_path: Path, capsys) -> None:
    """A sweep run again under the same name (same directory, same trial ids) says that its
    completed trials are not rerun; trials of another config in that directory do not count."""
    from distillab.driver.sweep import print_completed_before
    from distillab.tables import write_rows

    sweep = load_sweep(SMOKE, {"storage_path": str(tmp_path)})
    root = sweep.sweep_dir()
    print_completed_before(root, sweep)
    assert capsys.readouterr().out == ""
    first = sweep.trials[0]
    row = {"trial_id": first.trial_id, "status": "completed", "start_time": 0.0, "end_time": 1.0,
           "checkpoint": None, "error": None, **first.flat()}
    write_rows(root, "trials", [row], key=first.trial_id)
    write_rows(root, "trials", [{**row, "trial_id": "other-config"}], key="other-config")
    print_completed_before(root, sweep)
    assert capsys.readouterr().out == (f"[sweep] 1 of {len(sweep.trials)} trials already completed in {root}: their "
                                       "stored results are reported, not rerun (a new --set name=... starts afresh)\n")


def test_the_console_script_runs_the_exit_handlers_and_keeps_the_status(tmp_path: Path) -> None:
    """`cli.run` ends the process with ``os._exit`` (no teardown of every module's objects),
    after what Python's own exit does for the work: the ``atexit`` handlers run, in their order,
    and what was printed reaches the pipe; the exit status is `cli.main`'s (2 here: a report of
    a directory that is no sweep)."""
    code = ("import atexit, sys\n"
            "from distillab.driver import cli\n"
            "atexit.register(lambda: print('registered first, runs last', flush=True))\n"
            "atexit.register(lambda: print('registered last, runs first'))\n"
            "print('before', end=' ')\n"
            f"sys.argv = ['distillab', 'report', {str(tmp_path / 'none')!r}]\n"
            "cli.run()\n"
            "print('never')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stdout.splitlines() == ["before registered last, runs first", "registered first, runs last"]
    assert "no such sweep directory" in run.stderr


def test_a_process_start_time_is_read_to_the_clock_tick() -> None:
    """`telemetry.process_start_time` (what ``[time] start-up`` and ``[time] total`` count from)
    of a process started now is now, to within a few clock ticks (``/proc/stat``'s ``btime``
    alone, whole seconds, was up to 1 s off); None for a process that does not exist."""
    from distillab.recipe.telemetry import process_start_time

    before = time.time()
    child = subprocess.Popen(["sleep", "5"])
    after = time.time()
    try:
        started = process_start_time(child.pid)
        assert before - 0.05 <= started <= after + 0.05, (before, started, after)
    finally:
        child.kill()
        child.wait()
    assert process_start_time(2**22 + 7) is None


def test_token_auth_is_said_only_before_ray_reads_its_mode(monkeypatch) -> None:
    """`distillab sweep` asks for Ray's token authentication by environment before Ray is imported;
    in a process that imported Ray already (main() in-process), Ray has read its mode, and a new
    one would reach the cluster's processes only (the driver then fails "InvalidAuthToken")."""
    import ray  # noqa: F401  (imported, as in the tests that call main())

    from distillab.driver.environ import env_defaults

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    env_defaults(local_ray=True)
    assert "RAY_AUTH_MODE" not in os.environ
    fresh = ("import os, sys; from distillab.driver.cli import main; from distillab.driver.environ import env_defaults; "
             "assert 'ray' not in sys.modules; env_defaults(local_ray=True); print(os.environ['RAY_AUTH_MODE'])")
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    out = subprocess.run([sys.executable, "-c", fresh], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "token"


def test_trials_that_end_together_share_one_progress_table(monkeypatch) -> None:
    """`sweep.CalmReporter`: a change is printed settle_s after it (or at the sweep's end), so two
    trials ending 0.4 s apart print one table, not two near-identical ones; a lone change is printed
    once, and Tune's periodic print still comes every max_report_frequency seconds."""
    from types import SimpleNamespace

    import distillab.driver.sweep as sweep

    clock = [1000.0]
    monkeypatch.setattr(sweep.time, "time", lambda: clock[0])
    rep = sweep.CalmReporter(max_report_frequency=300, settle_s=2.0)
    a, b = SimpleNamespace(status="PENDING"), SimpleNamespace(status="PENDING")

    def at(t: float, done: bool = False) -> bool:
        clock[0] = 1000.0 + t
        return rep.should_report([a, b], done)

    assert not at(0.0)                      # all pending: nothing to show
    a.status = b.status = "RUNNING"
    assert [at(1.0), at(2.5), at(3.0), at(3.1)] == [False, False, True, False]  # running: once, 2 s later
    assert not at(200.0) and at(303.5) and not at(304.0)  # Tune's own print, 300 s after the last table
    a.status = "TERMINATED"
    assert not at(400.0)
    b.status = "TERMINATED"
    assert not at(400.4) and not at(402.0) and at(402.4) and not at(402.5)  # one table for both ends
    assert not at(403.0, done=True)        # the end: already printed
    a.status = b.status = "RUNNING"        # a change right before the end is printed at the end
    at(500.0)
    a.status = "ERROR"
    assert at(500.3, done=True)


def test_the_keys_left_out_of_the_trackers_are_rays_own() -> None:
    """`sweep.TUNE_PROCESS_KEYS` is Ray's list of the keys its W&B callback moves into the run's
    config (a Ray upgrade that changes it shows here)."""
    pytest.importorskip("wandb")
    from ray.air.integrations.wandb import WandbLoggerCallback

    from distillab.driver.sweep import TUNE_PROCESS_KEYS

    assert sorted(WandbLoggerCallback.AUTO_CONFIG_KEYS) == sorted(TUNE_PROCESS_KEYS)
