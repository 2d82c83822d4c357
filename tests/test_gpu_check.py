"""benchmarks/gpu_check.sh, the first check to run on a GPU machine, run here on CPU
as CI runs it: every GPU row skipped with its reason, every CPU row passing, so that the
script does not rot between the days it runs on a GPU. Slow: ~2 min (five rows, each in
its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _helpers import REPO, load_script


def _module():
    return load_script("benchmarks/gpu_check.py")


@pytest.mark.slow
def test_gpu_check_on_cpu(tmp_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test checks the CPU run (on a GPU, run bash benchmarks/gpu_check.sh itself)")
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--json", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    mod = _module()
    assert list(rows) == [r.name for r in mod.ROWS]
    for row in mod.ROWS:
        got = rows[row.name]
        if row.where == "gpu":
            assert got["status"] == "skip" and "CUDA" in got["reason"], got
        else:
            assert got["status"] == "pass", got
    assert "worst rel. err." in rows["ops-torch"]["reason"] and "3 steps" in rows["trial-tiny-bpe"]["reason"]
    assert "staleness [0.0, 1.0, 1.0, 1.0]" in rows["trial-stale-k1"]["reason"]
    assert "3 requests to the service, losses equal the in-worker teacher's" in rows["trial-shared-teacher"]["reason"]
    assert "| trial-tiny-bpe | pass |" in proc.stdout  # the printed table
    assert (tmp_path / "gpu_check.log").read_text().count("=====") == 5  # each run row's output, in $OUT


def test_rows_skip_for_missing_packages_and_devices() -> None:
    mod = _module()
    row = mod.Row("x", "any", ("not_a_package_here",), 10, lambda: "")
    assert mod._skip_reason(row, cuda=False) == ("python packages not installed here: not_a_package_here "
                                                 "(pip install -e '.[gpu]')")
    gpu_only = mod.Row("y", "gpu", (), 10, lambda: "")
    assert mod._skip_reason(gpu_only, cuda=False) == "needs a CUDA GPU (none here)"
    assert mod._skip_reason(gpu_only, cuda=True) is None
    cpu_only = next(r for r in mod.ROWS if r.name == "triton-interpret")
    assert "triton-compiled" in mod._skip_reason(cpu_only, cuda=True)
    assert mod.format_table([{"name": "a", "status": "pass", "seconds": 1.25, "reason": "x | y"}]).splitlines()[-1] \
        == "| a | pass | 1.2 | x / y |"
