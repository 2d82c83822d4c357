"""`distillab sweep --dry-run` (platform/driver/plan.py) and the paper's sweep files (issue 16, items 1
and 2): checkpoint checks with one-line errors and exit 2 (for the real sweep too), the
placement of a trial's resources on a cluster, and the token / FLOP estimate by hand."""

from __future__ import annotations

import math
import re
from pathlib import Path

import _tolerance as tol
import pytest
import ray
from _checkpoints import llama3_pair, qwen2_pair

import distillab.models.precision as models
from distillab.driver.cli import main
from distillab.config import SweepConfig, TrialConfig, load_sweep
from distillab.models import build_char_tokenizer
from distillab.driver.plan import Cluster, bf16_cpu_note, check_checkpoints, estimate, placement, unplaceable
from distillab.tasks.countdown import countdown_user_text
from distillab.tasks.data import countdown_test_split

#: float64 roundings (tests/_tolerance.py, approx64) of an estimate: a mean prompt length over 32 prompts,
#: then a few products and sums (token counts are integers, exact in float64)
ROUNDINGS = 48

REPO = Path(__file__).resolve().parents[1]
PAPER = {n: REPO / "search_spaces" / f"{n}.yaml" for n in ("paper_llama", "paper_qwen", "paper_spectrum")}
SMOKE = REPO / "search_spaces" / "smoke.yaml"


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("standins")
    return {"llama3": llama3_pair(root), "qwen2": qwen2_pair(root)}


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(map(str, argv)))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _paths(pair) -> list[str]:
    return ["--set", f"models.teacher_path={pair[0]}", "--set", f"models.student_path={pair[1]}"]


def test_paper_files_hold_the_protocol_settings() -> None:
    """PROTOCOL.md §1-§6, value by value."""
    llama, qwen, spec = (load_sweep(p) for p in PAPER.values())
    for sweep in (llama, qwen, spec):
        t = sweep.trial
        assert (t.rollout.tau_t, t.rollout.tau_s, t.loss.tau_t, t.loss.tau_s) == (0.5, 1.0, 0.5, 1.0)
        o = t.optimizer
        assert (o.steps, o.prompts_per_step, o.rollouts_per_prompt, o.warmup_steps, o.clip) == (150, 32, 1, 10, 1.0)
        assert (o.betas, o.eps, o.weight_decay) == ((0.9, 0.999), 1e-8, 0.0)
        ev = t.evaluation
        assert (ev.id_items, ev.id_temperature, ev.top_p, ev.pass_n, ev.pass_k) == (200, 0.5, 1.0, 10, (1, 10))
        assert ev.pass_temperature["countdown3"] == 1.0 and ev.pass_temperature["countdown4e"] == 0.5
        assert ev.sparsity_taus == (1e-6, 1e-8) and ev.ood_backend == "lm_eval" and len(ev.lm_eval.tasks) == 7
        assert t.loss.estimator == "full" and t.precision == "bf16" and sweep.resources.gpus_per_worker == 1
        assert sorted({x.seed for x in sweep.trials}) == [42, 43, 44]
        assert sweep.models.teacher_path and sweep.models.student_path  # placeholders the user replaces
    for sweep in (llama, qwen):
        assert sweep.search.grid == {"rollout.policy": ["offpd", "onpd"], "loss.kind": ["forward", "reverse"],
                                     "optimizer.lr": [1e-5, 5e-5], "seed": [42, 43, 44]}
        assert len(sweep.trials) == 24 and sweep.trial.rollout.engine == "vllm" and sweep.trial.rlvr is None
    assert (llama.trial.loss.pad_vocab, qwen.trial.loss.pad_vocab) == (False, True)
    assert sorted({x.rollout.lambda_ for x in spec.trials}) == [-2, -1, 0, 1, 2] and len(spec.trials) == 30
    r = spec.trial.rlvr
    assert (r.task, r.steps, r.samples_per_prompt, r.temperature, r.top_p, r.lr, r.warmup_ratio, r.beta,
            r.correct_reward) == ("countdown4", 300, 8, 1.0, 0.95, 2e-6, 0.1, 0.0, 2.0)
    assert (spec.trial.rollout.alpha, round(spec.trial.rollout.clip_c, 6)) == (0.2, 2.197225)
    assert "countdown4" in spec.trial.evaluation.countdown_tasks


def test_every_changed_line_of_a_paper_file_says_why() -> None:
    """Each line that PROTOCOL.md leaves open or overrides carries its comment (torchtune
    style), and each file starts with the command that runs it."""
    for name, path in PAPER.items():
        text = path.read_text()
        assert f"distillab sweep search_spaces/{name}.yaml --dry-run" in text.split("\nname:")[0]
        for line in text.splitlines():
            if line.lstrip().startswith(("precision:", "gradient_checkpointing:", "attn_implementation:",
                                         "max_tokens:", "engine:", "pad_vocab: true", "limit:", "cpus_per_worker:",
                                         "prompts_per_step: 32  ", "lora:", "offpd_reuse:", "sort_operands:")):
                assert "#" in line, f"{path.name}: {line.strip()!r} has no comment"


def test_paper_dry_run_prints_the_plan_with_stand_in_checkpoints(standins, capsys) -> None:
    rc, out, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", *_paths(standins["llama3"]),
                        "--nodes", 1, "--node-cpus", 64, "--node-gpus", 8)
    assert rc == 0, err
    assert str(standins["llama3"][0].resolve()) in out and "tokenizer: shared, 400 tokens, a chat template" in out
    assert "trials: 24" in out and out.count(": 150 steps x 32 prompts") == 24
    assert "8 trial(s) at a time" in out and "24 trials in 3 wave(s)" in out
    assert "1 Train worker(s) x (7.99 CPU, 1 GPU)" in out and "ASSUMED" in out and "GPU-hours" in out
    rc, out, _ = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", *_paths(standins["llama3"]),
                      "--node-cpus", 4, "--node-gpus", 0)
    assert rc == 1 and "NEVER placeable: a worker needs 7.99 CPU and 1 GPU on one node" in out
    rc, out, err = _cli(capsys, "sweep", PAPER["paper_qwen"], "--dry-run", *_paths(standins["qwen2"]),
                        "--node-cpus", 16, "--node-gpus", 1, "--throughput", 400)
    assert rc == 0, err
    assert "lm_head 512 rows" in out and "lm_head 448 rows" in out and "loss.pad_vocab" in out
    assert "1 trial(s) at a time" in out and "400 TFLOP/s per GPU, --throughput" in out
    rc, out, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", *_paths(standins["llama3"]),
                        "--node-cpus", 16, "--node-gpus", 2, "--set", "resources.local_mode=true")
    assert rc == 0, err
    assert "one Tune trial actor running the trial (resources.local_mode; no Train worker group) of 7.99 + " in out
    assert "2 trial(s) at a time" in out and "resources.compile" not in out
    rc, out, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", *_paths(standins["llama3"]),
                        "--node-cpus", 16, "--node-gpus", 2, "--set", "resources.compile=true")
    assert rc == 0, err
    assert "training passes compiled (resources.compile): each trial process compiles them at its first steps" in out


@pytest.mark.parametrize("dry", [True, False])
def test_a_missing_checkpoint_is_one_line_and_exit_2(standins, capsys, tmp_path, dry) -> None:
    """For the real sweep too: no traceback, nothing prepared or written (the check runs before
    prepare; Ray, which starts beside it, is shut down again)."""
    teacher = standins["llama3"][0]
    args = ["--set", "models.teacher_path=/nonexistent/dir", "--set", f"models.student_path={teacher}",
            "--set", f"storage_path={tmp_path}"] + (["--dry-run"] if dry else [])
    rc, out, err = _cli(capsys, "sweep", PAPER["paper_llama"], *args)
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [
        "distillab: models.teacher_path: /nonexistent/dir does not exist (give a checkpoint directory: "
        "--set models.teacher_path=DIR)"]
    assert not list(tmp_path.iterdir()) and not ray.is_initialized()
    rc, _, err = _cli(capsys, "prepare", PAPER["paper_llama"], *args[:4])
    assert rc == 2 and "models.teacher_path: /nonexistent/dir does not exist" in err
    rc, _, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", "--set", f"models.teacher_path={tmp_path}",
                      "--set", f"models.student_path={teacher}")
    assert rc == 2 and f"models.teacher_path: {tmp_path} is not a checkpoint directory (no config.json" in err
    # both bad: one line names both (the paper files' own placeholder paths)
    rc, out, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", "--set", f"models.teacher_path={tmp_path}")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"models.teacher_path: {tmp_path} is not a checkpoint directory" in err
    assert "; models.student_path: " in err and "does not exist (give a checkpoint directory" in err


def test_mismatched_pairs_are_named(standins, capsys) -> None:
    llama, qwen = standins["llama3"], standins["qwen2"]
    rc, _, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", "--set", f"models.teacher_path={llama[0]}",
                      "--set", f"models.student_path={qwen[1]}")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "teacher tokenizer has 400 tokens, student has 385: they must match" in err and str(qwen[1]) in err
    rc, _, err = _cli(capsys, "sweep", PAPER["paper_llama"], "--dry-run", *_paths(qwen))  # pad_vocab false
    assert rc == 2 and "512 rows and the student's 448" in err and "trial.loss.pad_vocab: true" in err
    rc, _, err = _cli(capsys, "sweep", PAPER["paper_spectrum"], "--dry-run", *_paths(qwen),
                      "--set", "trial.loss.pad_vocab=true")
    assert rc == 2 and "rollout.policy 'spectrum' needs lm_heads of one size" in err


def test_micro_dry_run_says_the_models_would_be_prepared(capsys, tmp_path) -> None:
    cache = tmp_path / "models"
    rc, out, err = _cli(capsys, "sweep", SMOKE, "--dry-run", "--set", f"models.cache_dir={cache}",
                        "--node-cpus", 2, "--node-gpus", 0)
    assert rc == 0, err
    assert out.count("micro, would be prepared at " + str(cache.resolve())) == 2
    assert "trials: 2" in out and "2 trial(s) at a time" in out and "asks for no GPUs" in out
    assert not cache.exists()  # nothing prepared
    # with models.teacher_refine the sweep's teacher is the GRPO-refined one: named, where prepare puts it
    refine = "models.teacher_refine={task: countdown3, steps: 7, lr: 1.0e-4, max_tokens: 32}"
    rc, out, err = _cli(capsys, "sweep", SMOKE, "--dry-run", "--set", f"models.cache_dir={cache}", "--set", refine,
                        "--node-cpus", 2, "--node-gpus", 0)
    from distillab.config import load_sweep
    from distillab.recipe.prepare import prepare_key, refined_teacher_dir

    sweep = load_sweep(SMOKE, {"models.cache_dir": str(cache), "models.teacher_refine": {
        "task": "countdown3", "steps": 7, "lr": 1.0e-4, "max_tokens": 32}})
    grpo = refined_teacher_dir(sweep, cache.resolve() / f"teacher-{prepare_key(sweep, 'teacher')}")
    assert rc == 0 and grpo.name.startswith("teacher-grpo-"), err
    assert f"then GRPO-refined by prepare (7 steps on countdown3; the sweep's teacher), at {grpo}\n" in out
    assert not cache.exists()
    rc, out, _ = _cli(capsys, "sweep", REPO / "search_spaces" / "smoke_optuna.yaml", "--dry-run", "--node-cpus", 2,
                      "--node-gpus", 0)
    assert rc == 0 and "6 trials in 3 wave(s)" in out and "for the sweep's 6 trials" in out  # num_samples
    assert ("trials: 6 (optuna: samples over optimizer.lr, rollout.lambda; listed: the base trial each sample "
            "starts from)\n  spectrum0-forward-lr0.001-s42-") in out
    # a union of grids names the keys of every grid (and the searchable keys a grid's `set` fixes)
    rc, out, _ = _cli(capsys, "sweep", REPO / "search_spaces" / "micro_findings.yaml", "--dry-run",
                      "--set", f"models.cache_dir={cache}", "--node-cpus", 2, "--node-gpus", 0)
    assert rc == 0 and ("trials: 66 (grid over rollout.policy, loss.kind, optimizer.lr, seed, rollout.lambda)"
                        in out), out[:2000]


def test_bf16_on_a_cpu_without_native_bf16_gets_a_note(monkeypatch, capsys, tmp_path) -> None:
    """A bf16 sweep on CPU workers gets a note where the CPU lacks native bf16 matrix products
    (the dry-run's last line; `distillab sweep` prints the same line before `prepare`): its
    trials compute them in float32 (`models.Bf16MatmulsInFloat32`); fp32 sweeps, GPU workers
    and CPUs with them get none."""
    findings = load_sweep(REPO / "search_spaces" / "micro_findings.yaml")  # bf16, bf16 masters, CPU workers
    monkeypatch.delenv("DISTILLAB_BF16_MATMULS", raising=False)
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    note = bf16_cpu_note(findings)
    assert note is not None and note.startswith("note: trial.precision 'bf16' on CPU workers")
    assert "float32 copies of the bf16 operands" in note
    assert bf16_cpu_note(load_sweep(SMOKE)) is None  # fp32
    assert bf16_cpu_note(load_sweep(REPO / "search_spaces" / "micro_findings.yaml",
                                    {"resources.gpus_per_worker": 1})) is None
    cache = tmp_path / "models"
    rc, out, _ = _cli(capsys, "sweep", REPO / "search_spaces" / "micro_findings.yaml", "--dry-run",
                      "--set", f"models.cache_dir={cache}", "--node-cpus", 2, "--node-gpus", 0)
    assert rc == 0 and out.rstrip().endswith(note)
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert bf16_cpu_note(findings) is None
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "float32")  # asked for on a CPU that has native bf16
    assert "and DISTILLAB_BF16_MATMULS=float32: the trials compute them" in bf16_cpu_note(findings)
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "bf16")  # refused before anything starts, exit 2
    rc, out, err = _cli(capsys, "sweep", REPO / "search_spaces" / "micro_findings.yaml",
                        "--set", f"models.cache_dir={cache}")
    assert rc == 2 and "DISTILLAB_BF16_MATMULS='bf16'; allowed values: auto, native, float32" in err
    assert not cache.exists()  # nothing prepared


def test_estimate_by_hand() -> None:
    """Token and FLOP counts of a small trial, with the prompt lengths counted by hand (the
    character tokenizer: one id per character, 3 for the chat template's role tokens)."""
    tok = build_char_tokenizer()
    trial = TrialConfig.model_validate({
        "rollout": {"policy": "offpd", "max_tokens": 20},
        "optimizer": {"steps": 10, "prompts_per_step": 4, "rollouts_per_prompt": 2},
        "evaluation": {"id_items": 6, "pass_items": 3, "pass_n": 2, "pass_k": [1, 2], "ood_items": 5,
                       "max_tokens": 8, "countdown_tasks": ["countdown3"]},
    })
    problems = countdown_test_split(trial.tasks, "countdown3", 32)
    p3 = sum(3 + len("Countdown.") + len(countdown_user_text(p, "{nums} -> {target}", True)) for p in problems) / 32
    est = estimate(trial, tok, n_teacher=30, n_student=7)
    assert est.prompt_tokens["countdown3"] == tol.approx64(p3, ROUNDINGS)
    assert est.tokens["distill"] == tol.approx64(10 * 4 * 2 * (p3 + 20), ROUNDINGS)
    assert est.flops["distill"] == tol.approx64(est.tokens["distill"] * (2 * 30 + 2 * 30 + 6 * 7), ROUNDINGS)  # sample, score, update
    ood = est.prompt_tokens["ood"]
    stage = (6 + 3 * 2) * (p3 + 8) + 5 * 4 * (ood + 8)  # Countdown-3 accuracy + pass@k samples, 4 micro OOD skills
    assert est.tokens["eval"] == tol.approx64(stage, ROUNDINGS) and est.pre_eval_tokens == tol.approx64(stage, ROUNDINGS)
    assert est.flops["eval"] == tol.approx64(stage * 2 * 7, ROUNDINGS)
    onpd = estimate(trial.model_copy(update={"rollout": trial.rollout.model_copy(update={"policy": "onpd"}),
                                             "gradient_checkpointing": True}), tok, 30, 7)
    assert onpd.flops["distill"] == tol.approx64(est.tokens["distill"] * (2 * 7 + 2 * 30 + 8 * 7), ROUNDINGS)


def test_estimate_of_the_math_domain_by_hand() -> None:
    """The math domain distils and scores math prompts: their mean length (the chat template's
    3 role tokens, the system prompt, the problem, one id per character) makes the rollout
    sequence, and the evaluation adds math accuracy + pass@k samples to the Countdown ones."""
    from distillab.tasks.math_task import math_test_split

    tok = build_char_tokenizer()
    trial = TrialConfig.model_validate({
        "domain": "math", "rollout": {"policy": "onpd", "max_tokens": 96},
        "optimizer": {"steps": 10, "prompts_per_step": 4, "rollouts_per_prompt": 1},
        "evaluation": {"id_items": 6, "pass_items": 3, "pass_n": 2, "pass_k": [1, 2], "ood_items": 5,
                       "max_tokens": 96, "countdown_tasks": ["countdown3"], "math_items": 7},
    })
    cfg = trial.tasks.math
    items = math_test_split(cfg, 32, trial.tasks.test_seed)
    pm = sum(3 + len(cfg.system_prompt) + len(it.problem) for it in items) / 32
    est = estimate(trial, tok, n_teacher=30, n_student=7)
    assert est.prompt_tokens["math"] == tol.approx64(pm, ROUNDINGS)
    assert est.tokens["distill"] == tol.approx64(10 * 4 * (pm + 96), ROUNDINGS)
    p3, ood = est.prompt_tokens["countdown3"], est.prompt_tokens["ood"]
    assert est.tokens["eval"] == tol.approx64((6 + 3 * 2) * (p3 + 96) + (7 + 3 * 2) * (pm + 96) + 5 * 4 * (ood + 96), ROUNDINGS)


def test_placement_by_hand() -> None:
    sweep = load_sweep(SMOKE, {"resources": {"num_workers": 3, "cpus_per_worker": 4, "gpus_per_worker": 1,
                                             "max_concurrent_trials": 4}})
    p = placement(sweep, Cluster(2, 16, 2))  # 2 workers a node (GPU-bound), 4 in all: one 3-worker trial
    assert (p.concurrent, p.cpus, p.gpus) == (1, 12.01, 3)
    assert placement(sweep, Cluster(2, 16, 4)).concurrent == 2  # 8 workers: 2 trials (the grid has 2)
    never = placement(sweep, Cluster(8, 3, 8))
    assert never.concurrent == 0 and "needs 4 CPU and 1 GPU on one node" in never.why
    big = placement(sweep, Cluster(1, 64, 2))
    assert big.concurrent == 0 and "holds 2 such workers" in big.why
    # local mode: the worker's 1 CPU and the trainable's 0.5 are one actor's, on one node
    local = load_sweep(SMOKE, {"resources": {"local_mode": True, "cpus_per_worker": 1, "trial_cpus": 0.5,
                                             "max_concurrent_trials": 4}})
    assert placement(local, Cluster(1, 3, 0)).concurrent == 2  # 3 CPUs: two 1.5-CPU actors
    never = placement(local, Cluster(3, 1, 0))  # 1-CPU nodes hold no 1.5-CPU actor
    assert never.concurrent == 0 and "a trial (resources.local_mode: its one actor) needs 1.5 CPU" in never.why


def test_unplaceable_on_a_cluster_of_mixed_nodes() -> None:
    """What `distillab sweep` asks right after Ray connects (the nodes' totals, not what is free):
    a trial no node kind can hold, alone or together, is named with the resource and the capacity."""
    def sweep(**r):
        return load_sweep(SMOKE, {f"resources.{k}": v for k, v in r.items()})

    cpu_box, gpu_8, gpu_16 = (2.0, 0.0), (8.0, 1.0), (16.0, 1.0)
    assert unplaceable(sweep(), [cpu_box]) is None and unplaceable(sweep(gpus_per_worker=1), []) is None
    assert unplaceable(sweep(gpus_per_worker=1), [cpu_box]) == (
        "resources: no trial can ever be placed on the Ray cluster (1 x (2 CPU, 0 GPU) node(s)): a worker needs "
        "0.99 CPU and 1 GPU on one node (resources.cpus_per_worker, gpus_per_worker); a node of the Ray cluster has "
        "2 CPU and 0 GPU")
    assert unplaceable(sweep(gpus_per_worker=1), [cpu_box, gpu_8]) is None  # the GPU node holds it
    assert "a worker needs 64 CPU and 0 GPU" in unplaceable(sweep(cpus_per_worker=64), [cpu_box, gpu_16])
    two = sweep(gpus_per_worker=1, num_workers=2)  # one GPU worker on each of two kinds of node: placeable
    assert unplaceable(two, [gpu_8, gpu_16]) is None and unplaceable(two, [gpu_8, gpu_8]) is None
    why = unplaceable(sweep(gpus_per_worker=1, num_workers=3), [cpu_box, gpu_8, gpu_16])
    assert why.startswith("resources: no trial can ever be placed on the Ray cluster (1 x (2 CPU, 0 GPU), "
                          "1 x (8 CPU, 1 GPU), 1 x (16 CPU, 1 GPU) node(s)): a trial needs 3 workers"), why


def test_check_checkpoints_of_a_mixed_sweep(standins) -> None:
    """A checkpoint teacher with a micro student: the micro role stands for the character
    tokenizer it would be prepared with, so the pair is refused before anything is trained."""
    sweep = load_sweep(SMOKE, {"models.teacher_path": str(standins["llama3"][0])})
    assert isinstance(sweep, SweepConfig)
    with pytest.raises(ValueError, match="teacher tokenizer has 400 tokens, student has 108"):
        check_checkpoints(sweep)


def test_parameter_counts_of_the_paper_models_from_their_configs(tmp_path) -> None:
    """--dry-run reads configs and tokenizers only: config-only directories of the paper's
    architectures give their published parameter counts (and Qwen2.5's padded heads)."""
    from _checkpoints import config_only

    want = {"llama-3.1-8b": 8_030_261_248, "llama-3.2-1b": 1_235_814_400, "qwen2.5-7b": 7_615_616_512,
            "qwen2.5-1.5b": 1_543_714_304}
    paths = {n: config_only(tmp_path, n) for n in want}
    for teacher, student, paper in (("llama-3.1-8b", "llama-3.2-1b", "paper_llama"),
                                    ("qwen2.5-7b", "qwen2.5-1.5b", "paper_qwen")):
        roles = check_checkpoints(load_sweep(PAPER[paper], {"models.teacher_path": str(paths[teacher]),
                                                            "models.student_path": str(paths[student])}),
                                  weights=False)  # the dry-run's check: no weights in these folders
        assert (roles["teacher"].params, roles["student"].params) == (want[teacher], want[student])
    assert {r.vocab_rows for r in roles.values()} == {152_064, 151_936}


def test_help_is_for_users(capsys) -> None:
    """``distillab --help`` shows the commands with one line each and the console note, not
    the module docstring's paragraph for developers."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    for cmd in ("prepare", "sweep", "report", "findings"):
        assert re.search(rf"^    {cmd} +\S", out, re.M), out  # listed with its help line
    assert "`--verbose` prints everything." in out and "``" not in out
    assert "Lazy imports" not in out and "HARMLESS_RAY_LINES" not in out


def test_dry_run_costs_the_shared_teacher(capsys, tmp_path) -> None:
    """``teacher.serve: shared``: the plan counts one teacher per node against one per concurrent trial
    (the smoke teacher in fp32 on 2 nodes of 2 CPUs: 2 copies against 4) and each payload's bytes per
    token by hand (V = 108 tokens, H = 64: logits 108 x 4, hidden 64 x 4, top-4 4 x 8 + 4); a sweep
    without it prints no such line."""
    sets = ["--set", f"models.cache_dir={tmp_path}", "--node-cpus", 2, "--node-gpus", 0, "--nodes", 2]
    rc, out, err = _cli(capsys, "sweep", SMOKE, "--dry-run", *sets)
    assert rc == 0 and "teacher service" not in out, err
    rc, out, err = _cli(capsys, "sweep", SMOKE, "--dry-run", *sets, "--set", "resources.max_concurrent_trials=4", "--set",
                        "search.grid=null", "--set", "search.grids=[{set: {teacher.serve: shared, teacher.payload: "
                        "hidden}, grid: {seed: [1, 2]}}, {set: {teacher.serve: shared, teacher.payload: topk, "
                        "teacher.top_k: 4}, grid: {seed: [1, 2]}}]")
    assert rc == 0, err
    m = re.search(r"teacher service \(teacher.serve shared, 4 of the trials\): one teacher per node, "
                  r"2 x ([\d.]+)kB = ([\d.]+)kB of parameters \(fp32\), \+ its lm_head \(27.6kB\) in each of the "
                  r"4 concurrent trial\(s\), against 4 x ([\d.]+)kB = ([\d.]+)kB in the workers", out)
    assert m, out
    one, two, one_b, four = map(float, m.groups())
    # printed to 3 significant digits (plan._fmt): each within half a unit of its third digit of its value
    half = lambda x: 0.5 * 10 ** (math.floor(math.log10(x)) - 2)  # noqa: E731
    assert one == one_b and abs(two - 2 * one) <= half(two) + 2 * half(one)
    assert abs(four - 4 * one) <= half(four) + 4 * half(one)
    assert 108 * 64 * 4 == 27648  # the lm_head's bytes above: V x H x 4
    assert "payload bytes per token: logits (in-worker) 432, hidden 256, topk 4 36" in out
