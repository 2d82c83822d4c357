"""Sweep YAML validation (platform/config.py): the repo's search spaces, errors that
name the field, the paper's defaults (PROTOCOL.md), frozen configs, overrides."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from distillab.config import ConfigError, SweepConfig, TrialConfig, expand_trials, load_sweep
from distillab.recipe.prepare import prepare_key

REPO = Path(__file__).resolve().parents[1]
MICRO = REPO / "search_spaces" / "micro.yaml"
SMOKE = REPO / "search_spaces" / "smoke.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(text)
    return p


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_sweep(_write(tmp_path, text))
    return str(e.value)


# --------------------------------------------------------------------------------------
# the repo's search spaces
# --------------------------------------------------------------------------------------


def test_micro_yaml_expands_to_eight_trials() -> None:
    cfg = load_sweep(MICRO)
    assert cfg.name == "micro"
    trials = expand_trials(cfg)
    assert len(trials) == 8  # 2 policies x 2 KL x 2 LRs x 1 seed
    points = {(t.rollout.policy, t.loss.kind, t.optimizer.lr, t.seed) for t in trials}
    assert len(points) == 8
    assert {p[0] for p in points} == {"offpd", "onpd"}
    assert {p[1] for p in points} == {"forward", "reverse"}
    lrs = {p[2] for p in points}
    assert len(lrs) == 2 and all(lr > 0 for lr in lrs)
    assert len({p[3] for p in points}) == 1
    assert set(itertools.product(["offpd", "onpd"], ["forward", "reverse"], sorted(lrs), [trials[0].seed])) == points
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == 8
    assert ids == [t.trial_id for t in expand_trials(load_sweep(MICRO))]  # deterministic


def test_trial_id_is_readable(tmp_path: Path) -> None:
    text = (
        "name: t\nsearch:\n  grid:\n    rollout.policy: [onpd]\n    loss.kind: [reverse]\n"
        "    optimizer.lr: [3.0e-4]\n    seed: [7]\n"
    )
    (t,) = expand_trials(load_sweep(_write(tmp_path, text)))
    assert t.trial_id.startswith("onpd-reverse-lr0.0003-s7-")
    assert len(t.trial_id) == len("onpd-reverse-lr0.0003-s7-") + 8


def test_smoke_yaml_loads() -> None:
    cfg = load_sweep(SMOKE)
    assert cfg.name == "smoke"
    trials = expand_trials(cfg)
    assert [t.rollout.policy for t in trials] == ["offpd", "onpd"]
    assert len({t.trial_id for t in trials}) == 2


# --------------------------------------------------------------------------------------
# errors name the field
# --------------------------------------------------------------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: t\nbogus_key: 1\n")
    assert "bogus_key" in msg


def test_unknown_nested_key(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: t\ntrial:\n  optimizer:\n    lrr: 0.001\n")
    assert "trial.optimizer.lrr: unknown field (did you mean 'lr'?); allowed: ['betas', 'checkpoint_every', 'clip', " in msg


@pytest.mark.parametrize("sets, match", [
    ({"trial.optimzer.lr": 1e-3}, r"trial.optimzer: unknown field \(did you mean 'optimizer'\?\); allowed: \[.*'optimizer'"),
    ({"nme": "x"}, r"nme: unknown field \(did you mean 'name'\?\); allowed: \['fault_tolerance', 'models', 'name', "),
    ({"trial.tasks.math.chain_lenght": 3}, r"trial.tasks.math.chain_lenght: unknown field \(did you mean 'chain_length'"),
    ({"trial.loss.zzz": 3}, r"trial.loss.zzz: unknown field; allowed: \['beta', 'estimator', "),  # nothing close
])
def test_a_misspelled_override_names_the_closest_field_and_the_allowed_ones(sets, match) -> None:
    assert pytest.raises(ConfigError, load_sweep, REPO / "search_spaces" / "smoke.yaml", sets).match(match)


@pytest.mark.parametrize("lr", ["0", "-1.0e-5"])
def test_non_positive_lr(tmp_path: Path, lr: str) -> None:
    msg = _error(tmp_path, f"name: t\ntrial:\n  optimizer:\n    lr: {lr}\n")
    assert "optimizer.lr" in msg


def test_unknown_policy(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: t\ntrial:\n  rollout:\n    policy: sideways\n")
    assert "trial.rollout.policy: Input should be 'offpd', 'onpd' or 'spectrum' (got 'sideways')" in msg, msg
    assert "'offpd'" in msg and "'onpd'" in msg
    msg = _error(tmp_path, "name: t\nresources: {local_mode: maybe}\n")  # a boolean names its allowed values too
    assert "resources.local_mode: Input should be a valid boolean, unable to interpret input (got 'maybe'); " \
           "allowed: true, false" in msg, msg


def test_invalid_grid_value(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: t\nsearch:\n  grid:\n    optimizer.lr: [1.0e-3, -1]\n")
    assert "optimizer.lr" in msg
    assert "-1" in msg


def test_unsearchable_grid_key(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: t\nsearch:\n  grid:\n    tasks.system_prompt: [a, b]\n")
    assert "tasks.system_prompt" in msg and "not searchable" in msg


def test_empty_grid_list(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: t\nsearch:\n  grid:\n    optimizer.lr: []\n")
    assert "optimizer.lr" in msg


def test_micro_model_head_dim_below_32(tmp_path: Path) -> None:
    text = (
        "name: t\nmodels:\n  micro_student:\n    hidden_size: 64\n    num_layers: 1\n"
        "    num_heads: 4\n    intermediate_size: 64\n    sft_steps: 1\n"
    )
    msg = _error(tmp_path, text)  # head_dim 64/4 = 16
    assert "micro_student" in msg and "32" in msg


def test_invalid_yaml(tmp_path: Path) -> None:
    msg = _error(tmp_path, "name: [unclosed\ntrial: {\n")
    assert "YAML" in msg


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    _error(tmp_path, "- a\n- b\n")


def test_bad_name(tmp_path: Path) -> None:
    assert "name" in _error(tmp_path, "name: has space\n")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_sweep(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------------------
# the paper's defaults (PROTOCOL.md)
# --------------------------------------------------------------------------------------


def test_defaults_are_the_papers(tmp_path: Path) -> None:
    cfg = load_sweep(_write(tmp_path, "name: t\n"))
    t = cfg.trial
    assert t == TrialConfig()
    assert t.rollout.tau_t == 0.5 and t.rollout.tau_s == 1.0
    assert t.loss.tau_t == 0.5 and t.loss.tau_s == 1.0
    o = t.optimizer
    assert o.lr == 1e-5
    assert o.warmup_steps == 10
    assert o.clip == 1.0
    assert o.steps == 150
    assert o.prompts_per_step == 32
    assert o.betas == (0.9, 0.999)
    assert o.eps == 1e-8
    assert o.weight_decay == 0.0
    e = t.evaluation
    assert e.sparsity_taus == (1e-6, 1e-8)
    assert e.pass_n == 10
    assert e.pass_k == (1, 10)
    assert e.id_items == 200
    assert e.id_temperature == 0.5
    assert e.pass_temperature == {"countdown3": 1.0, "countdown4e": 0.5, "countdown4": 1.0}  # 4: PROTOCOL.md §6 T = 1.0
    tasks = t.tasks
    assert tasks.countdown3.pool == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75)
    assert tasks.countdown3.n_operands == 3
    assert tasks.countdown4e.pool == tuple(range(1, 11)) and tasks.countdown4e.n_operands == 4
    assert tasks.countdown4.n_operands == 4 and tasks.countdown4.target_max == 10_000
    # the default grid: 2 policies x 2 KL directions
    assert len(expand_trials(cfg)) == 4


# --------------------------------------------------------------------------------------
# frozen configs and overrides
# --------------------------------------------------------------------------------------


def test_configs_are_frozen() -> None:
    cfg = load_sweep(SMOKE, overrides={"trial.optimizer.lr": 1e-3})
    with pytest.raises(ValidationError):
        cfg.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cfg.trial.optimizer.lr = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cfg.models.micro_teacher.hidden_size = 256  # type: ignore[misc]
    assert cfg.trial.optimizer.lr == 1e-3


def test_overrides(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: t\ntrial:\n  optimizer:\n    lr: 1.0e-3\n")
    cfg = load_sweep(path, overrides={"trial.optimizer.lr": 2e-5, "storage_path": "elsewhere"})
    assert cfg.trial.optimizer.lr == 2e-5
    assert cfg.storage_path == "elsewhere"
    assert load_sweep(path).trial.optimizer.lr == 1e-3  # the file is unchanged
    assert load_sweep(MICRO, overrides={"trial.optimizer.lr": 2e-5}).trial.optimizer.lr == 2e-5
    with pytest.raises(ConfigError, match="optimizer.lr"):
        load_sweep(MICRO, overrides={"trial.optimizer.lr": -2e-5})


def test_sweep_dir_is_absolute(tmp_path: Path) -> None:
    cfg = load_sweep(_write(tmp_path, f"name: t\nstorage_path: {tmp_path}/runs\n"))
    assert cfg.sweep_dir() == (tmp_path / "runs" / "t").resolve()
    assert isinstance(cfg, SweepConfig)


# --------------------------------------------------------------------------------------
# extends: a sweep file on top of another
# --------------------------------------------------------------------------------------


def test_extends_merges_mappings_and_replaces_lists(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "name: base\ntrial:\n  optimizer: {lr: 1.0e-3, steps: 7, warmup_steps: 2}\n  evaluation: {pass_k: [1, 10]}\n"
        "search:\n  grid:\n    loss.kind: [forward, reverse]\n    optimizer.lr: [1.0e-3, 3.0e-3]\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "child.yaml").write_text(
        "extends: ../base.yaml\nname: child\ntrial:\n  optimizer: {lr: 2.0e-3}\n  evaluation: {pass_k: [1]}\n"
        "search:\n  grid:\n    optimizer.lr: [3.0e-3]\n")
    cfg = load_sweep(tmp_path / "sub" / "child.yaml")
    assert cfg.name == "child"
    assert (cfg.trial.optimizer.lr, cfg.trial.optimizer.steps) == (2e-3, 7)  # merged key by key
    assert cfg.trial.evaluation.pass_k == (1,)  # a list replaces
    assert cfg.search.grid == {"loss.kind": ["forward", "reverse"], "optimizer.lr": [3e-3]}


def test_extends_errors_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"extends: cycle .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_sweep(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: extends: .*missing\.yaml does not exist"):
        load_sweep(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("extends: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"extends: must be a path"):
        load_sweep(tmp_path / "d.yaml")


def test_micro_rlvr_is_the_micro_study_plus_rlvr() -> None:
    micro, rl = load_sweep(MICRO), load_sweep(MICRO.parent / "micro_rlvr.yaml")
    assert rl.models == micro.models  # the same prepared teacher and student
    assert rl.trial.model_dump(exclude={"rlvr", "evaluation"}) == micro.trial.model_dump(exclude={"rlvr", "evaluation"})
    assert rl.trial.evaluation.countdown_tasks == ("countdown3", "countdown4e", "countdown4")
    assert rl.trial.rlvr is not None and rl.trial.rlvr.samples_per_prompt == 8
    assert [t.trial_id.split("-s42")[0] for t in expand_trials(rl)] == [
        "offpd-forward-lr0.003", "offpd-reverse-lr0.003", "onpd-forward-lr0.003", "onpd-reverse-lr0.003"]


@pytest.mark.parametrize("path", sorted((REPO / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_file_validates(path: Path) -> None:
    cfg = load_sweep(path)
    assert cfg.name == path.stem and expand_trials(cfg)  # the name is the file's, so runs/<name> is unambiguous


def test_the_replicates_study_is_grid_0_with_one_prepared_pair_per_seed() -> None:
    """scripts/replicates_study.sh's three sweeps (search_spaces/micro_replicates.yaml): together they
    are micro_findings.yaml's grid 0 trial for trial, each seed with its own prepare seed, and no two
    replicates share a prepared model."""
    script = (REPO / "scripts" / "replicates_study.sh").read_text()
    reps = [tuple(map(int, m)) for m in re.findall(r'"(\d+) (\d+)"', script)]
    assert reps == [(42, 0), (43, 2), (44, 4)]
    path = REPO / "search_spaces" / "micro_replicates.yaml"
    sweeps = [load_sweep(path, {"name": f"micro_replicates_s{s}", "models.prepare_seed": p, "search.grid.seed": [s]})
              for s, p in reps]
    findings = load_sweep(REPO / "search_spaces" / "micro_findings.yaml")
    scored = ("countdown3", "countdown4e", "countdown4")  # grid 0 scores Countdown-4 too: prepare's data stay the same
    grid0 = [t.model_copy(update={"evaluation": t.evaluation.model_copy(update={"countdown_tasks": scored})})
             for t in expand_trials(findings) if t.rlvr is None]
    got = [t for sw in sweeps for t in expand_trials(sw)]
    assert sorted(t.model_dump_json() for t in got) == sorted(t.model_dump_json() for t in grid0) and len(got) == 36
    assert [{t.seed for t in expand_trials(sw)} for sw in sweeps] == [{42}, {43}, {44}]
    keys = [prepare_key(sw, role) for sw in sweeps for role in ("teacher", "student")]
    assert len(set(keys)) == 6  # no two replicates share a prepared model
    assert keys[:2] == [prepare_key(findings, role) for role in ("teacher", "student")]  # replicate 1: the study's pair


def test_second_domain_and_style_files() -> None:
    micro = load_sweep(MICRO)
    mcq = load_sweep(MICRO.parent / "micro_mcq.yaml")
    assert mcq.trial.domain == "mcq" and mcq.trial.evaluation.mcq_items == 200
    assert mcq.models.micro_student == micro.models.micro_student  # the same student as the study
    assert mcq.models.micro_teacher.mcq_examples > 0 and sum(mcq.models.micro_teacher.countdown_examples.values()) == 0
    style = load_sweep(MICRO.parent / "micro_style.yaml")
    assert style.trial.tasks.teacher_conditioned and style.trial.evaluation.style.kind == "regex"
    assert [t.rollout.policy for t in expand_trials(style)] == ["offpd", "onpd"]


# --------------------------------------------------------------------------------------
# loss.estimator and its fields
# --------------------------------------------------------------------------------------


def _trial_error(loss: dict, **rest) -> str:
    with pytest.raises(ValidationError) as e:
        TrialConfig.model_validate({"loss": loss, **rest})
    return str(e.value)


def test_estimator_fields_and_their_errors() -> None:
    L = TrialConfig().loss
    assert (L.estimator, L.top_k, L.topk_source, L.topk_tail, L.k_gradient, L.oracle_every) == (
        "full", 64, "teacher", False, "auto", 10)
    msg = _trial_error({"estimator": "k4"})
    assert "loss.estimator" in msg and "'full', 'sampled', 'topk', 'k1', 'k2' or 'k3'" in msg
    assert "teacher" in _trial_error({"topk_source": "both"}) and "union" in _trial_error({"topk_source": "both"})
    assert "top_k" in _trial_error({"top_k": 0}) and "oracle_every" in _trial_error({"oracle_every": -1})
    assert "'score'" in _trial_error({"k_gradient": "reinforce"})
    msg = _trial_error({"estimator": "k3"}, rollout={"policy": "onpd"})
    assert "estimates the reverse KL" in msg and "loss.kind 'reverse'" in msg
    msg = _trial_error({"estimator": "k1", "kind": "reverse"})
    assert "rollout.policy 'onpd'" in msg and "'offpd'" in msg
    msg = _trial_error({"estimator": "topk", "impl": "triton"})
    assert "loss.impl 'triton'" in msg and "'chunked' or 'reference'" in msg
    assert "'forward' and 'reverse' only" in _trial_error({"estimator": "sampled", "kind": "jsd"})


def test_trial_ids_name_the_estimator() -> None:
    def tid(loss: dict, policy: str = "offpd") -> str:
        t = TrialConfig.model_validate({"seed": 1, "rollout": {"policy": policy}, "loss": loss})
        return t.trial_id.split("-lr")[0]

    assert tid({}) == "offpd-forward"  # full: the ids of earlier sweeps' form
    assert tid({"estimator": "sampled", "kind": "reverse"}) == "offpd-reverse-sampled"
    assert tid({"estimator": "topk", "top_k": 8}) == "offpd-forward-topk8-teacher"
    assert tid({"estimator": "topk", "top_k": 8, "topk_source": "union", "topk_tail": True}) == \
        "offpd-forward-topk8-union-tail"
    assert tid({"estimator": "k3", "kind": "reverse"}, "onpd") == "onpd-reverse-k3"
    assert tid({"estimator": "k1", "kind": "reverse", "k_gradient": "pathwise"}, "onpd") == "onpd-reverse-k1-pathwise"


def test_teacher_section_and_its_errors(tmp_path: Path) -> None:
    """``teacher:`` (issue 35 item 2): worker by default (today's trial ids unchanged); each bad
    combination is an error naming the field and the allowed values, from the YAML."""
    t = TrialConfig().teacher
    assert (t.serve, t.payload, t.top_k, t.label) == ("worker", None, None, "")
    # a trial at the default keeps the id it had before the section existed (main at 80980f5), so that
    # earlier sweeps' results and --resume find their trials; a shared teacher changes the hash
    assert TrialConfig().trial_id == "offpd-forward-lr1e-05-s42-06fc67f7"
    assert [t.trial_id for t in load_sweep(SMOKE).trials] == ["offpd-forward-lr0.001-s42-16e1cea3",
                                                              "onpd-forward-lr0.001-s42-28c869b0"]
    cases = [
        ("{serve: remote}", "teacher.serve", "'worker' or 'shared'"),
        ("{payload: hidden}", "teacher.payload 'hidden' needs teacher.serve 'shared'", "leave teacher.payload null"),
        ("{serve: shared}", "teacher.serve 'shared' needs teacher.payload", "allowed: hidden, topk"),
        ("{serve: shared, payload: logits}", "teacher.payload", "'hidden' or 'topk'"),
        ("{serve: shared, payload: topk}", "teacher.payload 'topk' needs teacher.top_k", "integer >= 1"),
        ("{serve: shared, payload: topk, top_k: 0}", "teacher.top_k", "greater than or equal to 1"),
        ("{serve: shared, payload: hidden, top_k: 8}", "teacher.top_k is read by teacher.payload 'topk' only",
         "leave it null"),
    ]
    for text, field, allowed in cases:
        msg = _error(tmp_path, f"name: t\ntrial:\n  teacher: {text}\n")
        assert field in msg and allowed in msg, (text, msg)
    msg = _error(tmp_path, "name: t\ntrial:\n  loss: {importance_weight: true}\n"
                           "  teacher: {serve: shared, payload: topk, top_k: 4}\n")
    assert "loss.importance_weight with rollout.policy 'offpd'" in msg and "payload 'hidden'" in msg
    msg = _error(tmp_path, "name: t\ntrial:\n  loss: {impl: triton}\n  teacher: {serve: shared, payload: topk, top_k: 4}\n")
    assert "loss.impl 'triton'" in msg
    ok = TrialConfig.model_validate({"seed": 1, "teacher": {"serve": "shared", "payload": "topk", "top_k": 8}})
    assert ok.trial_id.startswith("offpd-forward-topk8-lr")
    assert load_sweep(SMOKE).teacher_service is None
    shared = load_sweep(SMOKE, {"trial.teacher": {"serve": "shared", "payload": "hidden"}})
    assert shared.teacher_service.startswith("teacher-smoke-")
    assert all(t.trial_id.split("-")[2] == "hidden" for t in shared.trials)


def test_micro_payload_file() -> None:
    """search_spaces/micro_payload.yaml: OnPD at LR 3e-4, the shared teacher, payload hidden / top-8 /
    top-2 x forward, reverse x seeds 42-44, no RLVR stage, the oracle on; micro_findings.yaml's models."""
    cfg = load_sweep(REPO / "search_spaces" / "micro_payload.yaml")
    trials = cfg.trials
    assert len(trials) == 18 and len({t.trial_id for t in trials}) == 18
    assert {((t.teacher.payload, t.teacher.top_k), t.loss.kind, t.seed) for t in trials} == set(
        itertools.product([("hidden", None), ("topk", 8), ("topk", 2)], ["forward", "reverse"], [42, 43, 44]))
    assert all(t.teacher.serve == "shared" and t.rollout.policy == "onpd" and t.optimizer.lr == 3e-4
               and t.rlvr is None and t.loss.oracle_every > 0 and t.loss.estimator == "full" for t in trials)
    assert cfg.models == load_sweep(FINDINGS).models and cfg.teacher_service is not None


def test_ablation_sweep_files() -> None:
    """The robustness ablations and the estimator sweeps extend micro_findings.yaml: its prepared
    teacher and student, one changed setting each; the three robustness ablations on its
    policy x KL x LR x seed grid (grid 0), so that F1, F2 and F4 can be decided under each. The math
    file distils its own math teacher into micro.yaml's student."""
    from distillab.recipe.prepare import prepare_key

    findings, micro = load_sweep(FINDINGS), load_sweep(MICRO)
    files = {name: load_sweep(MICRO.parent / f"{name}.yaml") for name in (
        "micro_noclip", "micro_sampled", "micro_temps", "micro_estimators", "micro_topk", "micro_math")}
    for name, sweep in files.items():
        base = micro if name == "micro_math" else findings
        assert prepare_key(sweep, "student") == prepare_key(base, "student"), name
        same_teacher = prepare_key(sweep, "teacher") == prepare_key(base, "teacher")
        assert same_teacher is (name != "micro_math"), name
    grid0 = {(t.rollout.policy, t.loss.kind, t.optimizer.lr, t.seed) for t in findings.trials
             if t.rollout.policy != "spectrum"}
    for name in ("micro_noclip", "micro_sampled", "micro_temps"):
        trials = files[name].trials
        assert {(t.rollout.policy, t.loss.kind, t.optimizer.lr, t.seed) for t in trials} == grid0 and len(trials) == 36
    assert [t.optimizer.clip for t in files["micro_noclip"].trials] == [None] * 36
    assert {t.loss.estimator for t in files["micro_sampled"].trials} == {"sampled"}
    temps = files["micro_temps"].trials[0]
    assert (temps.rollout.tau_t, temps.rollout.tau_s, temps.loss.tau_t, temps.loss.tau_s) == (1.0, 0.5, 1.0, 0.5)
    # apart from the changed setting, an ablation's trial is the study's trial of the same cell
    study = {(t.rollout.policy, t.loss.kind, t.optimizer.lr, t.seed): t for t in findings.trials}
    noclip = files["micro_noclip"].trials[0]
    twin = study[noclip.rollout.policy, noclip.loss.kind, noclip.optimizer.lr, noclip.seed]
    assert noclip.model_dump(exclude={"optimizer", "evaluation"}) == twin.model_dump(exclude={"optimizer", "evaluation"})
    assert noclip.optimizer.model_dump(exclude={"clip"}) == twin.optimizer.model_dump(exclude={"clip"})
    est = files["micro_estimators"].trials
    assert [t.loss.estimator for t in est] == ["full", "sampled", "topk", "k1", "k2", "k3"]
    assert {(t.rollout.policy, t.loss.kind) for t in est} == {("onpd", "reverse")}
    topk = files["micro_topk"].trials
    assert {(t.loss.topk_source, t.loss.topk_tail) for t in topk} == {
        (s, tail) for s in ("teacher", "student", "union") for tail in (False, True)}
    math = files["micro_math"]
    assert math.trial.domain == "math" and math.trial.evaluation.math_items == 200
    assert math.models.micro_teacher.math_examples > 0 and sum(math.models.micro_teacher.countdown_examples.values()) == 0


# --------------------------------------------------------------------------------------
# a union of grids (search.grids)
# --------------------------------------------------------------------------------------

FINDINGS = REPO / "search_spaces" / "micro_findings.yaml"


def test_micro_findings_is_a_union_of_two_grids() -> None:
    cfg = load_sweep(FINDINGS)
    trials = cfg.trials
    grid = [t for t in trials if t.rollout.policy != "spectrum"]
    spec = [t for t in trials if t.rollout.policy == "spectrum"]
    lrs = sorted({t.optimizer.lr for t in grid})
    assert len(lrs) >= 3 and lrs[-1] / lrs[0] >= 10  # issue 17: >= 3 LRs spanning >= 10x
    assert {(t.rollout.policy, t.loss.kind, t.optimizer.lr, t.seed) for t in grid} == set(
        itertools.product(["offpd", "onpd"], ["forward", "reverse"], lrs, [42, 43, 44]))
    assert {(t.rollout.lambda_, t.loss.kind, t.seed) for t in spec} == set(
        itertools.product([-2.0, -1.0, 0.0, 1.0, 2.0], ["forward", "reverse"], [42, 43, 44]))
    assert len({t.optimizer.lr for t in spec}) == 1  # the spectrum at one LR
    assert all(t.rlvr is not None and t.rlvr.task == "countdown4" for t in spec)  # RLVR on Countdown-4 ...
    assert all(t.rlvr is None for t in grid)  # ... for the spectrum trials only
    assert all("countdown4" in t.evaluation.countdown_tasks for t in spec)
    assert len(trials) == 36 + 30 and len({t.trial_id for t in trials}) == 66
    # the grid trials are micro.yaml's trials at other LRs and seeds in bf16 with bf16 masters; the teacher is
    # micro.yaml's, the student micro.yaml's with four-operand practice added to its prior skills and twice the
    # SFT steps (docs/calibration.md)
    micro = load_sweep(MICRO)
    assert cfg.models.micro_teacher == micro.models.micro_teacher
    student = cfg.models.micro_student.model_dump()
    assert student.pop("countdown_examples") == {**micro.models.micro_student.countdown_examples,
                                                 "countdown4e": 15000, "countdown4": 15000}
    assert student.pop("sft_steps") == 2 * micro.models.micro_student.sft_steps
    assert student == micro.models.micro_student.model_dump(exclude={"countdown_examples", "sft_steps"})
    assert (grid[0].precision, grid[0].master_weights) == ("bf16", "bf16")
    same = {"optimizer", "seed", "precision", "master_weights"}
    assert grid[0].model_dump(exclude=same) == micro.trials[0].model_dump(exclude=same)
    assert cfg.search.grid == {} and cfg.search.grid_keys == [
        "rollout.policy", "loss.kind", "optimizer.lr", "seed", "rollout.lambda"]


def test_grids_order_set_merge_and_resume(tmp_path: Path) -> None:
    text = (
        "name: t\ntrial:\n  evaluation: {id_items: 7}\nsearch:\n  grids:\n"
        "    - grid: {rollout.policy: [offpd, onpd]}\n"
        "    - set: {rollout.policy: spectrum, optimizer.lr: 2.0e-4, evaluation: {pass_items: 5}}\n"
        "      grid: {rollout.lambda: [-1.0, 1.0], seed: [1]}\n"
    )
    cfg = load_sweep(_write(tmp_path, text))
    got = [(t.rollout.policy, t.rollout.lambda_, t.optimizer.lr, t.seed) for t in cfg.trials]
    assert got == [("offpd", None, 1e-5, 42), ("onpd", None, 1e-5, 42),
                   ("spectrum", -1.0, 2e-4, 1), ("spectrum", 1.0, 2e-4, 1)]
    spec = cfg.trials[2].evaluation
    assert (spec.pass_items, spec.id_items) == (5, 7)  # a mapping in set merges into the base's section
    assert cfg.trials[0].evaluation.pass_items == 100  # the other grid keeps the base's
    assert cfg.search.grid_keys == ["rollout.policy", "optimizer.lr", "rollout.lambda", "seed"]
    cfg.save(tmp_path)  # sweep.json, as distillab sweep writes it and --resume reads it
    again = SweepConfig.saved(tmp_path)
    assert [t.trial_id for t in again.trials] == [t.trial_id for t in cfg.trials] and again == cfg


@pytest.mark.parametrize("search, match", [
    ("  grid: {seed: [1]}\n  grids:\n    - grid: {seed: [2]}\n", r"search.grid and search.grids are exclusive"),
    ("  grids: []\n", r"search.grids must list at least one grid"),
    ("  grid: null\n", r"search.grid: null only goes with search.grids"),
    ("  grids:\n    - grid: {tasks.system_prompt: [a]}\n", r"grid key 'tasks.system_prompt' is not searchable"),
    ("  grids:\n    - grid: {seed: []}\n", r"grid\['seed'\] must be a non-empty list"),
    ("  grids:\n    - set: {seed: 1}\n      grid: {seed: [2]}\n", r"keys \['seed'\] are both in set and in grid"),
    ("  grids:\n    - grid: {seed: [1]}\n      sets: {}\n", r"search.grids.0.sets: unknown field \(did you mean 'set'\?\); allowed: \['grid', 'set'\]"),
    ("  grids:\n    - set: {rollout.policy: spectrum}\n      grid: {seed: [1]}\n",
     r"search.grids\[0\] point \{'seed': 1\} \(with set \{'rollout.policy': 'spectrum'\}\) is invalid: "
     r"rollout: rollout.lambda is required"),
    ("  grids:\n    - set: {rollout.polcy: onpd}\n      grid: {seed: [1]}\n", r"rollout.polcy: unknown field \(did you mean 'policy'\?\); allowed: \['alpha', 'clip_c', "),
    ("  grids:\n    - set: {seed.x: 1}\n      grid: {loss.kind: [forward]}\n",
     r"search.grids\[0\].set\['seed.x'\]: trial field 'seed' is not a section"),
    ("  grids:\n    - grid: {seed: [1, 2]}\n    - grid: {seed: [2]}\n",
     r"search.grids\[1\] point \{'seed': 2\} gives trial offpd-forward-lr1e-05-s2-\w+, which search.grids\[0\] "
     r"point \{'seed': 2\} gives already"),
    ("  kind: optuna\n  grids:\n    - grid: {seed: [1]}\n  space: {optimizer.lr: {uniform: [1.0e-4, 1.0e-3]}}\n",
     r"search.grids is not used when search.kind is 'optuna'"),
])
def test_grids_errors_name_the_field(tmp_path: Path, search: str, match: str) -> None:
    assert pytest.raises(ConfigError, load_sweep, _write(tmp_path, f"name: t\nsearch:\n{search}")).match(match)


def test_grids_rlvr_worker_check_applies_to_each_grid(tmp_path: Path) -> None:
    text = ("name: t\nresources: {num_workers: 3}\nsearch:\n  grids:\n    - grid: {seed: [1]}\n"
            "    - set: {rlvr: {task: countdown3, prompts_per_step: 4}}\n      grid: {seed: [2]}\n")
    assert pytest.raises(ConfigError, load_sweep, _write(tmp_path, text)).match(
        r"trial offpd-forward-lr1e-05-s2-\w+: rlvr.prompts_per_step \(4\) must be a multiple of resources.num_workers")


def test_local_mode_resources(tmp_path: Path) -> None:
    """``resources.local_mode`` gives the Tune trial actor the worker's CPUs and GPUs
    (the trial runs there), and needs one worker."""
    r = load_sweep(SMOKE).resources
    assert not r.local_mode and r.trial_actor() == {"CPU": r.trial_cpus}
    gpu = load_sweep(SMOKE, {"resources.local_mode": True, "resources.cpus_per_worker": 3,
                             "resources.trial_cpus": 0.5, "resources.gpus_per_worker": 1}).resources
    assert gpu.trial_actor() == {"CPU": 3.5, "GPU": 1}
    text = "name: t\nresources: {num_workers: 2, local_mode: true}\n"
    assert pytest.raises(ConfigError, load_sweep, _write(tmp_path, text)).match(
        r"resources.local_mode .* needs resources.num_workers 1 \(got 2\)")


def test_tracking_section(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    assert load_sweep(SMOKE).tracking.wandb is None and load_sweep(SMOKE).tracking.mlflow is None  # off by default
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("wandb", "mlflow") else importlib.util.find_spec(name, *a))
    for tracker in ("wandb", "mlflow"):
        msg = _error(tmp_path, f"name: t\ntracking: {{{tracker}: {{}}}}\n")
        assert f"tracking.{tracker} needs the {tracker} package" in msg and "'.[tracking]'" in msg
    monkeypatch.undo()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # both "installed"
    sweep = load_sweep(SMOKE, {"tracking": {"wandb": {"mode": "offline", "tags": ["a"]},
                                            "mlflow": {"tags": {"study": "micro"}}}})
    assert sweep.tracking.wandb.mode == "offline" and sweep.tracking.wandb.project == "distillab"
    assert sweep.tracking.mlflow.tracking_uri is None and sweep.tracking.mlflow.tags == {"study": "micro"}
    assert "tracking.wandb.mode" in _error(tmp_path, "name: t\ntracking: {wandb: {mode: sometimes}}\n")
    assert "tracking.neptune" in _error(tmp_path, "name: t\ntracking: {neptune: {}}\n")
    # trackers are not part of a trial: the trial ids do not change
    assert [t.trial_id for t in sweep.trials] == [t.trial_id for t in load_sweep(SMOKE).trials]


def test_every_seed_stream_keeps_the_numbers_of_the_recorded_runs() -> None:
    """Each random stream is a `config.SeedsConfig` method; at the defaults they give the seeds the
    formulas inline in the recipe gave before (hand-computed for s = 42, rank 1, step 3)."""
    from distillab.config import SeedsConfig

    z = SeedsConfig()
    assert z.rollout_seed(42, 3, 1) == 42 * 100003 + 3 * 97 + 1 == 4200418
    assert z.train_problems_seed(42) == 7961 and z.shuffle_seed(42, 1) == 42001 and z.loss_seed(42, 1) == 295
    assert z.rlvr_problems_seed(42) == 104771 and z.rlvr_shuffle_seed(42) == 42017
    assert z.rlvr_seed(42, 1) == 43 and z.rlvr_sampling_seed(43, 3) == 43 * 7919 + 93 == 340610
    assert [z.eval_task_seed(42, t, i) for i, t in enumerate(("countdown3", "countdown4e", "mcq", "math"))] == [
        42, 143, 446, 446]
    assert z.eval_pass_seed(143) == 144 and [z.eval_ood_seed(42, j) for j in range(3)] == [45, 52, 59]
    assert [SeedsConfig.test_split_seed(1000, t) for t in ("countdown3", "countdown4e", "countdown4", "mcq", "math")
            ] == [1000, 1001, 1007, 1011, 1013]
    assert SeedsConfig.prepare_seed(5, "teacher") == 5 and SeedsConfig.prepare_seed(5, "student") == 6
    assert [SeedsConfig.sft_seed(5, s) for s in (0, 1, "styled", "mcq", "skills", "math")] == [
        5000, 5001, 5029, 5023, 5017, 5031]
    # the class constants are no fields: a trial's config (its id, every cache key) does not hold them
    assert set(z.model_dump()) == set(SeedsConfig.model_fields) and "SFT_STREAMS" not in z.model_dump()
