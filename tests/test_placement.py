"""Issue 35, item 5: a paper sweep's trials placed on a simulated GPU cluster as
``distillab sweep --dry-run`` says (slow; real Ray, Tune, Train, DeepSpeed and vLLM actors).

A local Ray cluster of two nodes that advertise one GPU and 8 CPUs each through Ray's
resource flags (``ray.cluster_utils.Cluster``; no CUDA here) runs search_spaces/paper_llama.yaml
as ``distillab sweep --address`` runs it, with its resources, engine (vLLM) and placement
settings as they are and its compute swapped for the smoke models (search_spaces/smoke.yaml),
two trials, a few prompts and tokens. The paper's workers hold a GPU, so Ray Train would give
them an NCCL process group, which this CPU-only torch cannot build: ``DISTILLAB_TRAIN_BACKEND=gloo``
(`sweep.train_backend`) is the one seam, and it changes no resource request.

The test reads what Ray did while the trials start (no training needs to finish) from the
GCS's actor and placement-group tables, with node ids, and compares it with the plan
(`plan.placement`, `plan.dry_run` on the same cluster shape): each trial's Train worker in a
placement-group bundle of exactly the plan's CPUs and GPU, the plan's number of trials at a
time, each trial's vLLM rollout actor on its worker's node (Ray's owner address ties the two)
and reserving nothing, and the shared teacher service (``teacher.serve: shared``, issue 35 item 2)
one actor per node, reserving nothing either (the cluster's used CPUs and GPUs are the trials'
bundles and trainables only). Then it ends the driver (by PID) and the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distillab.config import TasksConfig, load_sweep
from distillab.driver.plan import Cluster as PlanCluster
from distillab.driver.plan import dry_run, placement
from distillab.driver.raystart import LOCAL_SYSTEM_CONFIG
from distillab.driver.sweep import TRAIN_BACKEND_ENV, train_backend

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
PAPER = REPO / "search_spaces" / "paper_llama.yaml"
SMOKE = REPO / "search_spaces" / "smoke.yaml"
NODES, NODE_CPUS, NODE_GPUS = 2, 8, 1  # each node fits one paper trial (7.99 + 0.01 CPUs, 1 GPU)
TIMEOUT_S = 420


def paper_overrides(tmp_path: Path, teacher: Path, student: Path) -> dict:
    """paper_llama.yaml with the compute swapped for the smoke models: two trials (OffPD and
    OnPD), 2 steps of 2 prompts, short prompts and completions, the micro evaluation. Resources,
    engine and vLLM settings are the paper file's."""
    tasks = {f"trial.tasks.{k}": TasksConfig.model_fields[k].default for k in ("system_prompt", "user_template")}
    return {
        "storage_path": str(tmp_path / "runs"), "models.cache_dir": str(tmp_path / "cache"),
        "models.teacher_path": str(teacher), "models.student_path": str(student),
        "search.grid": {"rollout.policy": ["offpd", "onpd"]}, **tasks,
        "trial.optimizer.steps": 2, "trial.optimizer.warmup_steps": 1, "trial.optimizer.prompts_per_step": 2,
        "trial.optimizer.train_prompts": 50, "trial.optimizer.checkpoint_every": 0,
        "trial.rollout.max_tokens": 8, "trial.rollout.vllm_max_model_len": 128,
        "trial.teacher": {"serve": "shared", "payload": "hidden"},  # issue 35 item 2: the teacher service, one per node
        "trial.evaluation": {"id_items": 2, "pass_items": 1, "pass_n": 2, "pass_k": [1, 2], "ood_items": 2,
                             "max_tokens": 6, "countdown_tasks": ["countdown3"], "ood_backend": "micro"},
    }


def _set_args(overrides: dict) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]  # JSON is YAML


def observe(n_trials: int, deadline: float, driver: subprocess.Popen) -> dict:
    """Poll the GCS until ``n_trials`` Train workers are alive at once, each with a rollout actor it
    created; returns {"workers", "rollouts", "owners" (worker by port), "teachers" (the teacher
    service's alive actors), "groups", "used"} seen then (fails on timeout or a dead driver)."""
    import ray
    from ray._private import state  # the GCS tables directly: no dashboard (its state API) to start

    while time.time() < deadline:
        assert driver.poll() is None, f"the sweep driver exited ({driver.returncode}) before its trials started"
        actors = [a for a in state.actors().values() if a["State"] == "ALIVE" or a["ActorClassName"] == "RolloutActor"]
        workers = [a for a in actors if a["ActorClassName"] == "RayTrainWorker" and a["State"] == "ALIVE"]
        owners = {w["Address"]["Port"]: w for w in workers}
        rollouts = [a for a in actors if a["ActorClassName"] == "RolloutActor" and a["State"] != "DEAD"
                    and a["Address"]["NodeID"].strip("0") and a["OwnerAddress"]["Port"] in owners]
        if len(workers) >= n_trials and len(rollouts) >= n_trials:
            groups = [g for g in ray.util.placement_group_table().values() if g["state"] == "CREATED"]
            total, free = ray.cluster_resources(), ray.available_resources()
            used = {r: round(total.get(r, 0.0) - free.get(r, 0.0), 6) for r in ("CPU", "GPU")}
            teachers = [a for a in actors if a["ActorClassName"] == "TeacherScorer" and a["State"] == "ALIVE"]
            return {"workers": workers, "rollouts": rollouts, "owners": owners, "teachers": teachers, "groups": groups,
                    "used": used}
        time.sleep(0.5)
    pytest.fail(f"{n_trials} trials with their rollout actors did not start within {TIMEOUT_S} s")


def test_the_train_backend_switch(monkeypatch) -> None:
    monkeypatch.delenv(TRAIN_BACKEND_ENV, raising=False)
    assert train_backend() is None  # auto: Ray Train's choice
    monkeypatch.setenv(TRAIN_BACKEND_ENV, " Gloo ")
    assert train_backend() == "gloo"
    monkeypatch.setenv(TRAIN_BACKEND_ENV, "mpi")
    with pytest.raises(ValueError, match="DISTILLAB_TRAIN_BACKEND must be one of auto, gloo, nccl, got 'mpi'"):
        train_backend()


@pytest.mark.slow
def test_paper_trials_are_placed_as_the_dry_run_says(tmp_path: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from distillab.recipe.prepare import prepare

    teacher, student = prepare(load_sweep(SMOKE, {"models.cache_dir": str(CACHE / "models")}), threads=1)
    overrides = paper_overrides(tmp_path, teacher, student)
    sweep = load_sweep(PAPER, overrides)
    shape = PlanCluster(NODES, NODE_CPUS, NODE_GPUS, "the simulated cluster")
    plan = placement(sweep, shape)
    text, ok = dry_run(sweep, shape)
    assert ok and (plan.workers, plan.cpus_per_worker, plan.gpus_per_worker, plan.trial_cpus) == (1, 7.99, 1.0, 0.01)
    assert plan.concurrent == 2  # one trial per node: 8 CPUs, 1 GPU each
    assert "1 Train worker(s) x (7.99 CPU, 1 GPU) + 0.01 CPU (the Tune trainable) = 8 CPU, 1 GPU" in text
    assert "2 trial(s) at a time" in text and "a vLLM engine" in text and "reserving nothing" in text
    assert "teacher service (teacher.serve shared, 2 of the trials): one teacher per node, 2 x " in text

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": NODE_CPUS, "num_gpus": NODE_GPUS,
                                                            "include_dashboard": False,
                                                            "_system_config": LOCAL_SYSTEM_CONFIG})
    driver = None
    try:
        for _ in range(NODES - 1):
            cluster.add_node(num_cpus=NODE_CPUS, num_gpus=NODE_GPUS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        env = {**os.environ, TRAIN_BACKEND_ENV: "gloo", "RAY_ADDRESS": cluster.address}
        cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(PAPER), "--address", cluster.address,
               "--no-dashboard", *_set_args(overrides)]
        log = (tmp_path / "driver.txt").open("w")
        driver = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        seen = observe(plan.concurrent, time.time() + TIMEOUT_S, driver)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()  # by its PID; the cluster's processes end with the cluster
            driver.wait(timeout=30)
        ray.shutdown()
        cluster.shutdown()
    nodes = {n: i for i, n in enumerate({w["Address"]["NodeID"] for w in seen["workers"]})}
    # the plan's trials at a time, and (8-CPU, 1-GPU nodes) one trial per node
    assert len(seen["workers"]) == plan.concurrent and len(nodes) == NODES, seen["workers"]
    # each worker's bundle: exactly the plan's CPUs and GPU, on the worker's node
    bundles = [(b, g["bundles_to_node_id"][i]) for g in seen["groups"] for i, b in g["bundles"].items()]
    worker_bundles = [(b, n) for b, n in bundles if b.get("GPU")]
    assert sorted(b["CPU"] for b, _ in worker_bundles) == [plan.cpus_per_worker] * plan.concurrent
    assert all(b["GPU"] == plan.gpus_per_worker for b, _ in worker_bundles)
    assert {n for _, n in worker_bundles} == set(nodes)
    # each rollout actor on its own trial's worker's node
    for r in seen["rollouts"]:
        assert r["Address"]["NodeID"] == seen["owners"][r["OwnerAddress"]["Port"]]["Address"]["NodeID"], r
    # the shared teacher: one service actor on each node, as the dry-run says
    assert sorted(t["Address"]["NodeID"] for t in seen["teachers"]) == sorted(nodes), seen["teachers"]
    # the rollout actors and the teacher service reserve nothing: what is used is the trials' bundles and trainables
    assert seen["used"] == {"CPU": round(plan.concurrent * plan.cpus, 6), "GPU": plan.concurrent * plan.gpus}
