#!/usr/bin/env bash
# Install, then run the micro study (prepare + 8-trial sweep + report) on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
exec .venv/bin/distillab sweep search_spaces/micro.yaml --no-dashboard "$@"
