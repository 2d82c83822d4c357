"""`distillab prepare` with ``models.teacher_refine``: the SFT teacher is refined with
the RLVR stage's GRPO/DAPO code, evaluated, saved as its own cached directory, and
that directory is what the sweep gets as its teacher."""

from __future__ import annotations

import json
from pathlib import Path

import _tolerance as tol
import pytest
import torch
from safetensors.torch import load_file

from distillab.config import load_sweep
from distillab.recipe.prepare import prepare, prepare_key, refine_key

#: float64 roundings (tests/_tolerance.py, approx64) of a mean of 10 rewards, computed twice (11 each)
ROUNDINGS = 32

REPO = Path(__file__).resolve().parents[1]
REFINE = {"task": "countdown3", "steps": 12, "prompts_per_step": 4, "samples_per_prompt": 4, "lr": 3e-3,
          "max_tokens": 12, "format_reward": 0.5, "train_prompts": 200, "warmup_ratio": 0.25}


def test_prepare_refines_the_teacher_with_grpo_and_caches_it(tmp_path: Path, capsys) -> None:
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "models.cache_dir": str(tmp_path / "models"), "models.teacher_refine": REFINE,
        "models.micro_teacher.sft_steps": 60,
    })
    teacher, student = prepare(sweep, threads=1)
    sft_dir = tmp_path / "models" / f"teacher-{prepare_key(sweep, 'teacher')}"
    assert teacher == tmp_path / "models" / f"teacher-grpo-{refine_key(sweep, sft_dir.name)}"
    info = json.loads((teacher / "prepare.json").read_text())
    assert info["refined_from"] == str(sft_dir) and info["steps"] == 12 and len(info["reward"]) == 12
    assert info["reward_first10"] == tol.approx64(sum(info["reward"][:10]) / 10, ROUNDINGS)
    assert info["reward_last10"] == tol.approx64(sum(info["reward"][-10:]) / 10, ROUNDINGS)
    assert all(0.0 <= r <= 2.5 for r in info["reward"])  # correct 2 + format 0.5 at most
    assert {(r["task"], r["metric"]) for r in info["evals"]} >= {("countdown3", "accuracy"), ("ood", "ood_mean")}
    assert sorted(p.name for p in teacher.iterdir()) == sorted(p.name for p in sft_dir.iterdir())  # a full model dir
    before, after = load_file(sft_dir / "model.safetensors"), load_file(teacher / "model.safetensors")
    assert before.keys() == after.keys()
    # the smoke teacher writes a well-formed <answer> block in some samples and not others, so the format
    # reward differs within groups, the advantages are not all 0 and the GRPO steps move the weights
    assert 0.0 < max(info["reward"])
    assert any(not torch.equal(before[k], after[k]) for k in before)
    out = capsys.readouterr().out
    assert "[prepare] teacher GRPO: 12 steps" in out
    # cached: the second call trains nothing and returns the same directory
    assert prepare(sweep, threads=1) == (teacher, student)
    assert "[prepare] teacher GRPO: cached at" in capsys.readouterr().out
    # another refinement setting is another directory; the SFT teacher is reused
    other = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "models.cache_dir": str(tmp_path / "models"), "models.teacher_refine": {**REFINE, "lr": 1e-3},
        "models.micro_teacher.sft_steps": 60})
    assert refine_key(other, sft_dir.name) != refine_key(sweep, sft_dir.name)
