#!/usr/bin/env bash
# Install, then run the whole test suite (fast and slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
export DISTILLAB_REQUIRE_VLLM=1  # tests/rollout/test_vllm.py fails (not skips) without vLLM
# DISTILLAB_TEST_WORKERS=2 runs the suite on two pytest-xdist workers, a work unit at a time (tests/conftest.py:
# a file, the smoke sweep's users, the multi-node cluster tests). Measured on a clean clone (2 cores): tests
# 1,067 s (one process: 1,590 s at 8228daa, on a loaded machine), but test_ray_job_submit failed there
# (the other worker's Ray held the dashboard-agent port; fixed since, not yet rerun under two workers),
# so one process stays the default.
exec .venv/bin/python -m pytest -q -m "slow or not slow" -p no:cacheprovider --durations=25 \
    -n "${DISTILLAB_TEST_WORKERS:-0}" --dist loadgroup "$@"
