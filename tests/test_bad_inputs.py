"""Bad inputs, one table (issue 34, item 2; DESIGN.md "Fail before compute"): each is refused
with exit status 2 and exactly one line on stderr that names the field or flag, before any
compute: Ray never started, no Ray process appeared, nothing written under ``storage_path``
or ``models.cache_dir``. ``distillab.driver.cli.main`` runs in this process (no interpreter or
import to pay per case).

Two kinds need a process of their own (slow tests): a trial the cluster can never place
(checked right after Ray connects, before any trial; exit 2), and Ctrl-C during start-up
(exit 130, one line, no file written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import ray

from distillab.driver.cli import main
from distillab.tasks.base import pool_head
from distillab.tasks.registry import get

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
OPTUNA = REPO / "search_spaces" / "smoke_optuna.yaml"


def sw(*sets: str, config: str = "{smoke}", extra: tuple[str, ...] = ()) -> list[str]:
    """``distillab sweep CONFIG`` with the output folders in the case's temporary directory, then ``sets``."""
    out = ["sweep", config, "--set", "storage_path={tmp}/out", "--set", "models.cache_dir={tmp}/models"]
    for s in sets:
        out += ["--set", s]
    return out + list(extra)


def dry(*sets: str, extra: tuple[str, ...] = ()) -> list[str]:
    return sw(*sets, extra=("--dry-run", *extra))


def prep(*sets: str, extra: tuple[str, ...] = ()) -> list[str]:
    return ["prepare", *sw(*sets)[1:], *extra]


#: (id, argv ({tmp}, {smoke}, {optuna} filled in), fragments the one line must hold, environment)
CASES: list[tuple[str, list[str], tuple[str, ...], dict[str, str]]] = [
    # --- the sweep file itself
    ("config-missing", ["sweep", "{tmp}/nope.yaml"], ("sweep file", "nope.yaml does not exist"), {}),
    ("config-is-a-directory", ["sweep", "{tmp}"], ("cannot be read as a sweep YAML",), {}),
    ("yaml-syntax-error", ["sweep", "{tmp}/syntax.yaml"], ("syntax.yaml: not valid YAML: line 3, column 1: expected the node content",), {}),
    ("yaml-top-level-list", ["sweep", "{tmp}/list.yaml"], ("top level must be a mapping",), {}),
    ("yaml-duplicate-grid-key", ["sweep", "{tmp}/dup_grid.yaml"],
     ("not valid YAML: line 6, column 5: duplicate key 'seed' (first given on line 5)",), {}),
    ("yaml-duplicate-trial", ["sweep", "{tmp}/dup_trial.yaml"],
     ("line 5, column 1: duplicate key 'trial' (first given on line 3)",), {}),
    ("extends-cycle", ["sweep", "{tmp}/cycle_a.yaml"], ("extends: cycle", "cycle_a.yaml -> "), {}),
    ("extends-missing", ["sweep", "{tmp}/ext_missing.yaml"], ("extends: ", "missing.yaml does not exist"), {}),
    ("extends-not-a-path", ["sweep", "{tmp}/ext_list.yaml"], ("extends: must be a path",), {}),
    ("no-config", ["sweep"], ("sweep needs a config YAML (or --resume PATH)",), {}),
    ("yaml-empty", ["sweep", "{tmp}/empty.yaml", "--set", "name=x"],
     ("empty.yaml: the sweep file is empty: give at least its name",), {}),
    ("yaml-all-comments", ["sweep", "{tmp}/comments.yaml", "--set", "name=x"],
     ("comments.yaml: the sweep file holds only comments",), {}),
    # --- --set
    ("set-without-equals", sw("trial.loss.kind"), ("--set expects KEY=VALUE",), {}),
    ("set-yaml-syntax-error", sw("search.grid=[1"), ("--set search.grid=[1: the value is not valid YAML: line 1",), {}),
    ("set-yaml-unclosed-mapping", sw("trial.optimizer={lr: 1"), ("--set trial.optimizer={lr: 1: the value is not valid",),
     {}),
    ("set-duplicate-key", sw("search.grid={seed: [1], seed: [2]}"),
     ("--set search.grid={seed: [1], seed: [2]}: the value is not valid YAML", "duplicate key 'seed'"), {}),
    # --- unknown keys and out-of-range values
    ("unknown-top-level-key", sw("bogus_key=1"), ("bogus_key: unknown field",), {}),
    ("unknown-nested-key", sw("trial.optimizer.lrr=0.001"), ("trial.optimizer.lrr: unknown field (did you mean 'lr'?)",),
     {}),
    ("misspelled-section", sw("trial.optimzer.lr=0.001"), ("trial.optimzer: unknown field (did you mean 'optimizer'?)",),
     {}),
    ("bad-name", sw("name=has space"), ("name: String should match pattern",), {}),
    ("lr-zero", sw("trial.optimizer.lr=0"), ("trial.optimizer.lr: Input should be greater than 0 (got 0)",), {}),
    ("lr-negative", sw("trial.optimizer.lr=-1.0e-5"), ("trial.optimizer.lr: Input should be greater than 0",), {}),
    ("steps-zero", sw("trial.optimizer.steps=0"), ("trial.optimizer.steps: Input should be greater than or equal to 1",),
     {}),
    ("betas-out-of-range", sw("trial.optimizer.betas=[1.0, 0.9]"), ("trial.optimizer.betas", "[0, 1)"), {}),
    ("zero-stage-4", sw("trial.optimizer.zero_stage=4"), ("trial.optimizer.zero_stage",), {}),
    ("unknown-policy", sw("trial.rollout.policy=sideways"),
     ("trial.rollout.policy: Input should be 'offpd', 'onpd' or 'spectrum' (got 'sideways')",), {}),
    ("unknown-ood-backend", sw("trial.evaluation.ood_backend=wiki"),
     ("trial.evaluation.ood_backend: Input should be 'micro', 'lm_eval' or 'pretrained' (got 'wiki')",), {}),
    ("prose-context-one", sw("trial.evaluation.ood_backend=pretrained", "trial.evaluation.prose.context=1"),
     ("trial.evaluation.prose.context: Input should be greater than or equal to 2",), {}),
    ("bool-not-a-bool", sw("resources.local_mode=maybe"), ("resources.local_mode", "allowed: true, false"), {}),
    ("num-workers-zero", sw("resources.num_workers=0"), ("resources.num_workers: Input should be greater than",), {}),
    ("cpus-per-worker-zero", sw("resources.cpus_per_worker=0"), ("resources.cpus_per_worker: Input should be greater",),
     {}),
    ("gpus-per-worker-negative", sw("resources.gpus_per_worker=-1"), ("resources.gpus_per_worker: Input should be",), {}),
    ("local-mode-two-workers", sw("resources.local_mode=true", "resources.num_workers=2"),
     ("resources.local_mode runs a trial in one process", "(got 2)"), {}),
    ("compile-with-zero3", sw("resources.compile=true", "trial.optimizer.zero_stage=3"),
     ("resources.compile does not run with trial.optimizer.zero_stage 3",), {}),
    ("staleness-with-zero3", sw("trial.rollout.policy=onpd", "trial.rollout.max_staleness=2",
                                "trial.optimizer.zero_stage=3", "search.grid={seed: [42]}"),
     ("trial: rollout.max_staleness > 0 copies the whole student",
      "set optimizer.zero_stage 0, 1 or 2, or rollout.max_staleness 0"), {}),
    ("worker-restarts-negative", sw("fault_tolerance.worker_restarts=-1"), ("fault_tolerance.worker_restarts",), {}),
    ("micro-head-dim-below-32", sw("models.micro_student.num_heads=4"), ("micro_student", "32"), {}),
    ("math-demos-beyond-the-pool", prep("models.micro_teacher.math_examples=20001"),
     ("models.micro_teacher.math_examples is 20001, more than the 20000 training problems of trial.tasks.math.train_items",), {}),
    ("mcq-demos-beyond-the-pool", sw("models.micro_student.mcq_examples=5", "trial.tasks.mcq.train_items=4"),
     ("models.micro_student.mcq_examples is 5, more than the 4 training problems of trial.tasks.mcq.train_items",), {}),
    # --- the grid
    ("grid-empty", sw("search.grid={}"), ("search.grid is empty: give at least one searchable key",), {}),
    ("grids-empty-list", sw("search.grids=[]"), ("search.grids must list at least one grid",), {}),
    ("grid-null-without-grids", sw("search.grid=null"), ("search.grid: null only goes with search.grids",), {}),
    ("grid-and-grids", sw("search.grids=[{grid: {seed: [1]}}]"), ("search.grid and search.grids are exclusive",), {}),
    ("grid-value-empty-list", sw("search.grid={optimizer.lr: []}"), ("search.grid['optimizer.lr'] must be a non-empty",),
     {}),
    ("grid-key-unsearchable", sw("search.grid={tasks.system_prompt: [a, b]}"),
     ("search.grid key 'tasks.system_prompt' is not searchable; allowed:",), {}),
    ("grid-point-invalid", sw("search.grid={optimizer.lr: [1.0e-3, -1]}"), ("optimizer.lr", "-1"), {}),
    ("grid-values-not-a-list", sw("search.grid={seed: 1}"), ("search.grid.seed: Input should be a valid list",), {}),
    ("grids-duplicate-trial", sw("search.grid=null", "search.grids=[{grid: {seed: [1, 2]}}, {grid: {seed: [2]}}]"),
     ("search.grids[1] point {'seed': 2} gives trial", "which search.grids[0]"), {}),
    # --- warm-up against the schedule
    ("warmup-equals-steps", sw("trial.optimizer.warmup_steps=4"),
     ("trial.optimizer.warmup_steps (4) must be below trial.optimizer.steps (4)",), {}),
    ("warmup-above-steps", sw("trial.optimizer.steps=1"),
     ("trial.optimizer.warmup_steps (2) must be below trial.optimizer.steps (1)",), {}),
    ("warmup-of-a-grid-point", sw("search.grid={optimizer.steps: [4, 2]}"),
     ("optimizer.warmup_steps (2) must be below trial.optimizer.steps (2)", ": trial "), {}),
    ("rlvr-warmup-whole-stage", sw("trial.rlvr={task: countdown3, steps: 10, warmup_ratio: 0.99, prompts_per_step: 2}"),
     ("trial.rlvr.warmup_ratio (0.99) x trial.rlvr.steps (10) is a warm-up of 10 steps",), {}),
    # --- estimator and loss pairs
    ("estimator-unknown", sw("trial.loss.estimator=k4"), ("loss.estimator", "'full', 'sampled', 'topk'"), {}),
    ("estimator-k3-forward", sw("trial.loss.estimator=k3", "search.grid={rollout.policy: [onpd]}"),
     ("estimates the reverse KL", "loss.kind 'reverse'"), {}),
    ("estimator-k1-offpd", sw("trial.loss.estimator=k1", "trial.loss.kind=reverse"), ("rollout.policy 'onpd'",), {}),
    ("estimator-topk-triton", sw("trial.loss.estimator=topk", "trial.loss.impl=triton"), ("loss.impl 'triton'",), {}),
    ("estimator-sampled-jsd", sw("trial.loss.estimator=sampled", "trial.loss.kind=jsd"), ("'forward' and 'reverse' only",),
     {}),
    ("rlvr-prompts-per-worker", sw("resources.num_workers=3", "trial.rlvr={task: countdown3, prompts_per_step: 4}"),
     ("trial.rlvr.prompts_per_step (4) must be a multiple of resources.num_workers (3)",), {}),
    # --- the search
    ("optuna-without-space", sw("search.space={}", config="{optuna}"), ("search.space must name at least one dimension",), {}),
    ("space-with-grid", sw("search.space={optimizer.lr: {uniform: [1.0e-4, 1.0e-3]}}"), ("search.space is only used",),
     {}),
    ("metric-not-reported", sw("search.metric=accuracy"), ("search.metric 'accuracy' is not a reported metric",), {}),
    ("metric-mode-lengths", sw("search.mode=[max, min]"), ("search.metric and search.mode must have the same length",),
     {}),
    ("optuna-domain-bounds", sw("search.space={optimizer.lr: {uniform: [2, 1]}}", config="{optuna}"), ("low < high",),
     {}),
    ("optuna-sampler", sw("search.sampler=cmaes", config="{optuna}"), ("search.sampler",), {}),
    # --- --resume
    ("resume-with-config", ["sweep", "{smoke}", "--resume", "{tmp}"], ("--resume takes the sweep directory only",), {}),
    ("resume-not-a-sweep-dir", ["sweep", "--resume", "{tmp}/models_missing"], ("--resume", "no sweep.json there"), {}),
    ("resume-bad-sweep-json", ["sweep", "--resume", "{tmp}/bad_sweep"],
     ("--resume", "sweep.json does not validate: bogus: unknown field"), {}),
    ("resume-sweep-json-not-json", ["sweep", "--resume", "{tmp}/torn_sweep"], ("--resume", "sweep.json is not valid JSON"),
     {}),
    # --- where results go
    ("storage-under-a-file", sw("storage_path={tmp}/afile/runs"),
     ("storage_path: {tmp}/afile/runs cannot be created: {tmp}/afile is a file, not a directory",), {}),
    ("storage-is-a-file", sw("storage_path={tmp}/afile"), ("storage_path: {tmp}/afile is a file, not a directory",), {}),
    ("storage-not-creatable", sw("storage_path=/proc/distillab-runs"), ("storage_path: /proc/distillab-runs cannot be",),
     {}),
    ("storage-not-writable", sw("storage_path=/sys"), ("storage_path: /sys is not writable",), {}),
    ("cache-dir-under-a-file", sw("models.cache_dir={tmp}/afile/models"), ("models.cache_dir: {tmp}/afile/models",), {}),
    ("prepare-cache-dir-a-file", prep("models.cache_dir={tmp}/afile"), ("models.cache_dir: {tmp}/afile is a file",), {}),
    # --- checkpoint folders
    ("teacher-missing", sw("models.teacher_path=/nonexistent/dir"),
     ("models.teacher_path: /nonexistent/dir does not exist (give a checkpoint directory",), {}),
    ("teacher-is-config-json", sw("models.teacher_path={tmp}/ckpt_full/config.json"),
     ("models.teacher_path: {tmp}/ckpt_full/config.json is a file",
      "give its folder: --set models.teacher_path={tmp}/ckpt_full"), {}),
    ("teacher-no-config", sw("models.teacher_path={tmp}/ckpt_empty"),
     ("models.teacher_path: {tmp}/ckpt_empty is not a checkpoint directory (no config.json in it)",), {}),
    ("teacher-no-tokenizer", sw("models.teacher_path={tmp}/ckpt_config"),
     ("models.teacher_path: {tmp}/ckpt_config has no tokenizer files: none of tokenizer.json",), {}),
    ("teacher-vocab-without-merges", sw("models.teacher_path={tmp}/ckpt_vocab"), ("vocab.json but no merges.txt",), {}),
    ("teacher-no-weights", sw("models.teacher_path={tmp}/ckpt_noweights"),
     ("models.teacher_path: {tmp}/ckpt_noweights has no weights: none of model.safetensors",), {}),
    ("both-checkpoints-bad", sw("models.teacher_path={tmp}/ckpt_empty", "models.student_path=/nonexistent/s"),
     ("models.teacher_path: ", "; models.student_path: /nonexistent/s does not exist"), {}),
    ("student-no-tokenizer-prepare", prep("models.student_path={tmp}/ckpt_config"),
     ("models.student_path: {tmp}/ckpt_config has no tokenizer files",), {}),
    ("dry-run-teacher-is-a-file", dry("models.teacher_path={tmp}/afile"),
     ("models.teacher_path: {tmp}/afile is a file, not a checkpoint directory",), {}),
    # --- environment switches
    ("env-bf16-matmuls", sw(), ("DISTILLAB_BF16_MATMULS='bf16'; allowed values: auto, native, float32",),
     {"DISTILLAB_BF16_MATMULS": "bf16"}),
    ("env-bf16-matmuls-dry-run", dry(), ("DISTILLAB_BF16_MATMULS='fast'; allowed values",),
     {"DISTILLAB_BF16_MATMULS": "fast"}),
    ("env-bf16-matmuls-prepare", prep(), ("DISTILLAB_BF16_MATMULS='FLOAT32'",), {"DISTILLAB_BF16_MATMULS": "FLOAT32"}),
    # --- numeric flags
    ("dry-run-nodes-zero", dry(extra=("--nodes", "0")), ("--nodes 0: must be >= 1",), {}),
    ("dry-run-nodes-negative", dry(extra=("--nodes", "-2")), ("--nodes -2: must be >= 1",), {}),
    ("dry-run-throughput-negative", dry(extra=("--throughput", "-5")), ("--throughput -5: must be > 0",), {}),
    ("dry-run-throughput-zero", dry(extra=("--throughput", "0")), ("--throughput 0: must be > 0",), {}),
    ("dry-run-throughput-nan", dry(extra=("--throughput", "nan")), ("--throughput nan: must be > 0",), {}),
    ("dry-run-node-cpus-zero", dry(extra=("--node-cpus", "0")), ("--node-cpus 0: must be > 0",), {}),
    ("dry-run-node-gpus-negative", dry(extra=("--node-gpus", "-1")), ("--node-gpus -1: must be >= 0",), {}),
    ("dry-run-two-bad-flags", dry(extra=("--nodes", "0", "--throughput", "-5")),
     ("--nodes 0: must be >= 1; --throughput -5: must be > 0",), {}),
    ("sweep-threads-negative", sw(extra=("--threads", "-1")), ("--threads -1: must be >= 1",), {}),
    ("prepare-threads-zero", prep(extra=("--threads", "0")), ("--threads 0: must be >= 1",), {}),
    # --- report and findings
    ("report-missing-dir", ["report", "{tmp}/nowhere"], ("report: no such sweep directory: {tmp}/nowhere",), {}),
    ("report-a-file", ["report", "{smoke}"], ("report: {smoke}: a file, not a sweep directory",), {}),
    ("report-not-a-sweep-dir", ["report", "{tmp}/ckpt_empty"], ("report: not a sweep directory (no sweep.json",), {}),
    ("report-plots-under-a-file", ["report", "{tmp}/bad_sweep", "--plots", "{tmp}/afile/figs"],
     ("report --plots: {tmp}/afile/figs cannot be created: {tmp}/afile is a file",), {}),
    ("report-plots-not-writable", ["report", "{tmp}/bad_sweep", "--plots", "/sys/figs"],
     ("report --plots: /sys/figs cannot be created in /sys",), {}),
    ("findings-missing-dir", ["findings", "{tmp}/nowhere"], ("findings: no such sweep directory",), {}),
    ("findings-out-a-file", ["findings", "{tmp}/bad_sweep", "--out", "{tmp}/afile"],
     ("findings --out: {tmp}/afile is a file, not a directory",), {}),
    ("env-cache-under-a-file", sw(), ("DISTILLAB_CACHE: {tmp}/afile/cache cannot be created",),
     {"DISTILLAB_CACHE": "{tmp}/afile/cache"}),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The files the cases point at: broken YAMLs, checkpoint folders each missing something,
    a file where a folder belongs, a sweep directory whose sweep.json does not validate."""
    tmp = tmp_path_factory.mktemp("bad_inputs")
    files = {
        "syntax.yaml": "name: t\ntrial: {optimizer: [\n",
        "list.yaml": "- a\n- b\n",
        "empty.yaml": "",
        "comments.yaml": "# a sweep\n\n  # to be written\n",
        "dup_grid.yaml": "name: t\nsearch:\n  grid:\n    rollout.policy: [offpd]\n    seed: [1]\n    seed: [2]\n",
        "dup_trial.yaml": "name: t\n\ntrial:\n  optimizer: {lr: 1.0e-3}\ntrial:\n  rollout: {max_tokens: 8}\n",
        "cycle_a.yaml": "extends: cycle_b.yaml\n",
        "cycle_b.yaml": "extends: cycle_a.yaml\n",
        "ext_missing.yaml": "extends: missing.yaml\n",
        "ext_list.yaml": "extends: [a.yaml]\n",
        "afile": "not a folder\n",
        "bad_sweep/sweep.json": '{"name": "x", "bogus": 1}',
        "torn_sweep/sweep.json": '{"name": "x", "sto',
        "ckpt_config/config.json": "{}",
        "ckpt_vocab/config.json": "{}", "ckpt_vocab/vocab.json": "{}",
        "ckpt_noweights/config.json": "{}", "ckpt_noweights/tokenizer.json": "{}",
        "ckpt_full/config.json": "{}", "ckpt_full/tokenizer.json": "{}", "ckpt_full/model.safetensors": "",
    }
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    (tmp / "ckpt_empty").mkdir()
    return tmp


def _fill(s: str, tmp: Path) -> str:
    return s.replace("{tmp}", str(tmp)).replace("{smoke}", str(SMOKE)).replace("{optuna}", str(OPTUNA))


def test_a_demonstration_pool_shorter_than_asked_is_an_error_naming_the_field() -> None:
    """`tasks.base.pool_head` (a pooled task's SFT data): the first n items, or (a ``files`` source shorter
    than the ``models.micro_<role>.<task>_examples`` asked) a ValueError naming the field and both counts,
    never a silent cut."""
    math = get("math").entry
    assert pool_head(list(range(5)), 3, math, "student") == [0, 1, 2]
    assert pool_head(list(range(5)), 5, math, "student") == list(range(5))
    with pytest.raises(ValueError, match=r"models\.micro_student\.math_examples asks for 6 demonstrations; the math "
                                         r"task has 5 training items"):
        pool_head(list(range(5)), 6, math, "student")


def test_the_table_has_sixty_kinds() -> None:
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, fragments, env", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2_before_anything_starts(world, capsys, monkeypatch, argv, fragments,
                                                                   env) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, _fill(v, world))
    if "DISTILLAB_BF16_MATMULS" not in env:
        monkeypatch.delenv("DISTILLAB_BF16_MATMULS", raising=False)
    children = {c.pid for c in psutil.Process().children(recursive=True)}
    before = sorted(p.name for p in world.iterdir())
    rc = main([_fill(a, world) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("distillab: "), err
    for f in fragments:
        assert _fill(f, world) in lines[0], lines[0]
    assert out == ""
    assert not ray.is_initialized()
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= children  # no Ray process appeared
    assert sorted(p.name for p in world.iterdir()) == before  # out/ and models/ never created
    assert json.loads((world / "bad_sweep" / "sweep.json").read_text()) == {"name": "x", "bogus": 1}


def _cli(tmp: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "distillab.driver.cli", "sweep", str(SMOKE), "--no-dashboard",
                             "--set", f"storage_path={tmp}/out", "--set", f"models.cache_dir={tmp}/models", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_a_trial_no_node_can_hold_exits_2_after_ray_connects(tmp_path) -> None:
    """``resources.gpus_per_worker=64``: no node of the local Ray has 64 GPUs, so the trial
    could never be placed; the sweep says so right after Ray connects, with the resource and
    the capacity, instead of waiting for ever. Nothing prepared, nothing written."""
    proc = _cli(tmp_path, "--set", "resources.gpus_per_worker=64")
    out, err = proc.communicate(timeout=600)
    lines = err.strip().splitlines()
    assert proc.returncode == 2, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("distillab: resources: no trial can ever be placed on the Ray cluster (1 x (")
    assert "a worker needs 0.99 CPU and 64 GPU on one node (resources.cpus_per_worker, gpus_per_worker)" in lines[0]
    assert "GPU) node(s))" in lines[0] and "[prepare]" not in out
    assert not (tmp_path / "out").exists() and not (tmp_path / "models").exists()


@pytest.mark.slow
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path) -> None:
    """SIGINT while Ray starts (its first process has appeared): exit 130, one line, Ray's
    processes gone, nothing written (sweep.json is written after the checks, atomically)."""
    proc = _cli(tmp_path)
    me = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    while not me.children(recursive=True) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    ray_procs = me.children(recursive=True)
    assert ray_procs, "Ray never started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == [
        ("distillab: interrupted (Ctrl-C); nothing half-written (a sweep already under way continues with "
         "distillab sweep --resume <storage_path>/<name>)")], err[-3000:]
    assert out == ""
    assert not (tmp_path / "out").exists()
    _, alive = psutil.wait_procs(ray_procs, timeout=30)
    assert not alive, [p.pid for p in alive]


def test_a_ctrl_c_python_swallowed_during_start_up_is_raised_when_it_ends() -> None:
    """`driver.api._start_up_interrupts` (the start-up of `distillab sweep` and `run_sweep` alike): a SIGINT
    whose KeyboardInterrupt is lost inside the start-up (as Python loses one raised in an at-fork or finaliser
    callback) still ends the start-up with KeyboardInterrupt; a start-up without one ends normally; the
    previous handler is restored."""
    import os

    from distillab.driver import api

    before = signal.getsignal(signal.SIGINT)
    with api._start_up_interrupts():
        pass
    with pytest.raises(KeyboardInterrupt):
        with api._start_up_interrupts():
            try:  # the interrupt is raised here and swallowed, as in a callback Python cannot raise from
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)
            except KeyboardInterrupt:
                pass
    assert signal.getsignal(signal.SIGINT) is before
