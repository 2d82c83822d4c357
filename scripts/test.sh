#!/usr/bin/env bash
# Install, then run the whole test suite (fast and slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
export DISTILLAB_REQUIRE_VLLM=1  # tests/rollout/test_vllm.py fails (not skips) without vLLM
exec .venv/bin/python -m pytest -q -m "slow or not slow" -p no:cacheprovider --durations=25 "$@"
