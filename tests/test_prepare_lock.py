"""`prepare` called at once from two places (two sweeps on one machine, two pytest-xdist
workers): each model is trained once, under its lock; the other caller waits and gets the
same cached directory. `_train_one` is replaced by a stand-in that records its calls and
takes 0.5 s, so the two callers overlap."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import distillab.recipe.prepare as prep
from distillab.config import load_sweep

REPO = Path(__file__).resolve().parents[1]


def test_two_callers_at_once_train_each_model_once(tmp_path: Path, monkeypatch) -> None:
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {"models.cache_dir": str(tmp_path)})
    calls: list[str] = []

    def train_one(role, sweep, mcfg, out_dir, threads):
        calls.append(role)
        time.sleep(0.5)  # long enough for the other caller to arrive while this one builds
        out_dir.mkdir()
        info = {"role": role, "params": 1, "examples": 1, "train_seconds": 0.0, "final_loss": 0.0, "evals": []}
        (out_dir / "prepare.json").write_text(json.dumps(info))
        return info

    monkeypatch.setattr(prep, "_train_one", train_one)
    results: list[tuple[Path, Path]] = []
    threads = [threading.Thread(target=lambda: results.append(prep.prepare(sweep, threads=1))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(calls) == ["student", "teacher"]  # one build per model, not two
    assert len(results) == 2 and results[0] == results[1]
    teacher, student = results[0]
    assert teacher.name == f"teacher-{prep.prepare_key(sweep, 'teacher')}"
    assert student.name == f"student-{prep.prepare_key(sweep, 'student')}"
    assert json.loads((teacher / "prepare.json").read_text())["role"] == "teacher"
