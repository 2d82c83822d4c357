"""Every recorded config keeps its identity through the Task protocol (issue 42, item 2): the
dumps, trial ids and cache keys of every ``search_spaces`` sweep, and the task data and
evaluation requests of eight of them, equal the values recorded on the code before the
protocol (tests/fixtures/config_identity.json, written by tests/fixtures/record_identity.py
on e3f17c0)."""

from __future__ import annotations

import json

import pytest

from fixtures.record_identity import DATA_SWEEPS, OUT, data_fingerprints, identities, sweep_files

RECORDED = json.loads(OUT.read_text())


def test_every_sweep_file_is_recorded() -> None:
    """A sweep file added later needs no record (it has no earlier identity); none recorded went away."""
    assert set(RECORDED["identities"]) <= set(sweep_files())


def test_dumps_trial_ids_and_cache_keys_are_unchanged() -> None:
    now = identities()
    for f, want in RECORDED["identities"].items():
        got = now[f]
        for part in ("tasks", "tasks_order", "sweep", "trials", "dumps", "prepare", "refine", "pre_eval", "offpd"):
            assert got[part] == want[part], (f, part)  # tasks_order: the section's keys in their recorded order


@pytest.mark.parametrize("name", [n for n in DATA_SWEEPS if n != "micro"])  # micro: micro_rlvr and micro_style
def test_task_data_and_evaluation_requests_are_unchanged(name: str) -> None:     # hold its paths (CI's time)
    got, want = data_fingerprints([name])[name], RECORDED["data"][name]
    assert got == want
