#!/usr/bin/env bash
# Install, then run the whole test suite (fast and slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
export DISTILLAB_REQUIRE_VLLM=1  # tests/rollout/test_vllm.py fails (not skips) without vLLM
# two pytest-xdist workers, a group at a time (tests/conftest.py: a file, or the smoke sweep's users, or the
# multi-node cluster tests): much of a Ray test is waiting, which the other worker's tests fill
exec .venv/bin/python -m pytest -q -m "slow or not slow" -p no:cacheprovider --durations=25 \
    -n "${DISTILLAB_TEST_WORKERS:-2}" --dist loadgroup "$@"
