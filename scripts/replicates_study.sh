#!/usr/bin/env bash
# Replicates with their own prepared models (issue 33; search_spaces/micro_replicates.yaml says why and what
# was predicted before it ran): three sweeps of the findings study's grid 0, trial seed 42/43/44 each with its
# own prepared teacher and student (models.prepare_seed 0/2/4), then `distillab findings` on the three pooled
# (F1, F2, F4; findings.md in runs/micro_replicates_s42<suffix>/). Needs an installed ./.venv
# (bash scripts/install.sh). Prints each sweep's wall time ([time] lines).
#
#   bash scripts/replicates_study.sh                                        # native bf16 products where the CPU has them
#   DISTILLAB_BF16_MATMULS=float32 bash scripts/replicates_study.sh --suffix _f32   # the float32-product mode
set -euo pipefail
cd "$(dirname "$0")/.."
suffix=""
if [ "${1:-}" = "--suffix" ]; then
    [ -n "${2:-}" ] || { echo "replicates_study.sh: --suffix needs a value (e.g. --suffix _f32)" >&2; exit 2; }
    suffix=$2; shift 2
fi
. scripts/env.sh
config=search_spaces/micro_replicates.yaml
start=$SECONDS
rc=0
dirs=()
for rep in "42 0" "43 2" "44 4"; do
    set -- $rep
    name=micro_replicates_s$1$suffix
    t0=$SECONDS
    .venv/bin/distillab sweep "$config" --no-dashboard --set name="$name" --set models.prepare_seed="$2" \
        --set "search.grid.seed=[$1]" || rc=$?
    echo "[time] replicate seed $1, prepare seed $2: $((SECONDS - t0)) s"
    dirs+=("runs/$name")
done
.venv/bin/distillab findings "${dirs[@]}" --only F1,F2,F4 || rc=$?
echo "[time] replicates study: $((SECONDS - start)) s"
exit $rc
