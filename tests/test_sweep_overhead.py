"""benchmarks/sweep_overhead.py's bound on a sweep's wall time from its loops alone
(`loop_bound`, printed by ``--phases``), on hand-made sweep records."""

from __future__ import annotations

import json
from pathlib import Path

from _helpers import load_script

def _module():
    return load_script("benchmarks/sweep_overhead.py")


def _sweep(tmp_path: Path, conc: int, seconds: dict) -> Path:
    (tmp_path / "sweep.json").write_text(json.dumps({"resources": {"max_concurrent_trials": conc}}))
    (tmp_path / "runs.json").write_text(json.dumps([{"seconds": {"sweep": 1.0}}, {"seconds": seconds}]))
    return tmp_path


def test_loop_bound_by_hand(tmp_path) -> None:
    bound = _module().loop_bound
    root = _sweep(tmp_path, 2, {"sweep": 300.0, "OffPD sets": 50.0, "trials": 240.0})
    trials = [{"loop": v} for v in (60.0, 60.0, 88.0, 88.0, float("nan"))]  # NaN: a trial without its loop
    # (60 + 60 + 88 + 88) / 2 = 148 > 88; + 50 s of OffPD sets = 198 s; 198 / 300 = 0.66; the latest run's seconds
    line = bound(root, trials, baseline=600.0)
    assert ">= 148.0 s" in line and ">= 198.0 s (0.66x of it)" in line
    assert "the sweep 0.50x, the bound 0.33x" in line
    # one long loop bounds the sweep by itself: max(100 / 2, 100) = 100 s, no OffPD sets
    root = _sweep(tmp_path, 2, {"sweep": 125.0, "trials": 120.0})
    assert ">= 100.0 s (0.80x of it)" in bound(root, [{"loop": 100.0}])
    (root / "runs.json").unlink()  # a sweep that recorded no run: nothing to say
    assert bound(root, [{"loop": 100.0}]) is None
