#!/usr/bin/env bash
# The GPU suite: one prepared run on a bare GPU machine (no pip install, no Ray, no
# network), from the repository root:
#
#     OUT=/some/dir bash bench/gpu_suite.sh            # $OUT defaults to bench/out
#     bash bench/gpu_suite.sh --cpu-dry-run             # the same steps, tiny, on a CPU
#
# Steps, each under its own timeout, a failure recorded and the next step run anyway:
#   1. env       nvidia-smi, Python/torch/Triton/CUDA versions, device name and compute
#                capability, the fp8 path the executor takes, the suite's imports;
#   2. tests     the kernel tests and the fp8 tests, COMPILED (TRITON_INTERPRET=0), with
#                no conftest (it imports the database layer), junit XML;
#   3. kernels   bench/kernels.py: bandwidth against a torch copy of the same size,
#                top-k vs torch.topk at ratio 0.01 up to 100M elements, fused
#                LayerNorm+GELU vs the torch pair (do_bench timings);
#   4. executor  bench/executor.py --no-ray: one RankWorker in process, gpt-char and a
#                GPT-2-small-shaped model (gpt-85m) under fp32 / bf16 / fp8 (the device's
#                fp8 path, and forced emulation): step time, samples/s, tokens/s, peak
#                memory, fp8 path, NVML power;
#   5. telemetry NVML power, clocks, temperature, memory sampled in the background over
#                the whole run (summarised per step);
#   6. merge     everything into $OUT/gpu_suite.json (next to gpu_suite_junit.xml and
#                gpu_suite.log; nothing else is written to $OUT).
#
# The package is not installed there: bench/gpu_suite.py assembles autotune as an
# installation lays it out (pyproject's package-dir) in a temporary directory, put first
# on PYTHONPATH with tests/ (for kernels_helpers.py and helpers.py).
#
# Environment: OUT; PYTHON (default python3); GPU_SUITE_BUDGET_S (default 470: no step
# starts with less than its minimum left, each step's timeout is cut to what is left);
# GPU_SUITE_PYTEST_K (a pytest -k expression, to narrow the tests of a dry run);
# GPU_SUITE_CPU_DRY_RUN=1 (as --cpu-dry-run).
set -u

DRY=${GPU_SUITE_CPU_DRY_RUN:-0}
for arg in "$@"; do
    case "$arg" in
        --cpu-dry-run) DRY=1 ;;
        -h | --help)
            sed -n '2,31p' "$0"
            exit 0
            ;;
        *)
            echo "gpu_suite.sh: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
OUT=${OUT:-bench/out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
BUDGET=${GPU_SUITE_BUDGET_S:-470}
T=$(mktemp -d "${TMPDIR:-/tmp}/gpu_suite.XXXXXX") || exit 2
LOG=$OUT/gpu_suite.log
JUNIT=$OUT/gpu_suite_junit.xml
rm -f "$LOG" "$JUNIT" "$OUT/gpu_suite.json"
STARTED=$(date +%s)
export GPU_SUITE_DRY_RUN=$DRY
export GPU_SUITE_TELEMETRY_INTERVAL=${GPU_SUITE_TELEMETRY_INTERVAL:-0.5}

log() { echo "[gpu_suite $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# Modules the GPU machine lacks: a dry run blocks them, so an import of one shows here.
BLOCK=ray,sqlalchemy,alembic,fastapi,uvicorn,pydantic,pydantic_settings,gymnasium,scipy
BLOCK=$BLOCK,pandas,psutil,platformdirs,prometheus_client,plotly,optuna,httpx,matplotlib
BLOCK=$BLOCK,psycopg,anyio

if [ "$DRY" = 1 ]; then
    log "CPU dry run: tiny sizes, TRITON_INTERPRET=1 for the tests, modules blocked: $BLOCK"
    "$PY" bench/gpu_suite.py assemble "$T/site" --block "$BLOCK" >>"$LOG" 2>&1
    export PYTHONPATH="$T/block:$T/site:$REPO/tests"
    export CUDA_VISIBLE_DEVICES=""
    TEST_INTERPRET=1
    DEVICE=cpu
    KERNEL_ARGS=(--device cpu --sizes "4K,8K" --repeat 1)
    EXECUTOR_ARGS=(--device cpu --models gpt-tiny --steps 2 --warmup 1
        --fp8-modes "auto,scaled_mm")
else
    "$PY" bench/gpu_suite.py assemble "$T/site" >>"$LOG" 2>&1
    export PYTHONPATH="$T/site:$REPO/tests"
    TEST_INTERPRET=0
    DEVICE=cuda
    KERNEL_ARGS=(--device cuda --sizes "1M,16M,100M")
    EXECUTOR_ARGS=(--device cuda --models "gpt-char,gpt-85m" --steps 20 --warmup 5
        --fp8-modes "auto,emulated")
fi
unset TRITON_INTERPRET
log "repo $REPO, OUT $OUT, temp $T, python $(command -v "$PY"), device $DEVICE"

left_s() { echo $((BUDGET - ($(date +%s) - STARTED))); }

# step NAME MIN_S MAX_S COMMAND...: runs COMMAND under min(MAX_S, budget left) seconds,
# its output into the log and $T/NAME.out; one line per step into $T/steps.jsonl.
step() {
    local name=$1 min=$2 max=$3
    shift 3
    local left limit start end rc ok timed_out
    left=$(left_s)
    limit=$max
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt "$min" ]; then
        log "step $name skipped: ${left}s of the ${BUDGET}s budget left, it needs ${min}s"
        printf '{"name":"%s","ok":false,"skipped":"budget","left_s":%s}\n' \
            "$name" "$left" >>"$T/steps.jsonl"
        return 0
    fi
    log "step $name (timeout ${limit}s): $*"
    start=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$T/$name.out" >>"$LOG"
    rc=${PIPESTATUS[0]}
    end=$(date +%s.%N)
    ok=false
    [ "$rc" -eq 0 ] && ok=true
    timed_out=false
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && timed_out=true
    printf '{"name":"%s","ok":%s,"rc":%s,"timed_out":%s,"timeout_s":%s,"start":%s,"end":%s,"seconds":%s,"command":"%s"}\n' \
        "$name" "$ok" "$rc" "$timed_out" "$limit" "$start" "$end" \
        "$(echo "$end - $start" | awk '{print $1 - $3}')" "${*//\"/\'}" >>"$T/steps.jsonl"
    log "step $name: rc=$rc"
}

# 5. telemetry, in the background for the whole run
"$PY" bench/gpu_suite.py telemetry "$T/telemetry.jsonl" \
    --interval "$GPU_SUITE_TELEMETRY_INTERVAL" >>"$LOG" 2>&1 &
TELEMETRY=$!

# 1. environment
step env 10 60 "$PY" bench/gpu_suite.py env "$T/env.json"

# 2. the kernel and fp8 tests, compiled on the GPU (the interpreter in a dry run). -P: the
# checkout's autotune/ (without kernels/) must not shadow the assembled package; no
# plugin autoload: exactly pytest-timeout and the progress log, on any machine.
EXTRA=()
[ -n "${GPU_SUITE_PYTEST_K:-}" ] && EXTRA=(-k "$GPU_SUITE_PYTEST_K")
GPU_SUITE_PROGRESS="$T/pytest-progress.jsonl" TRITON_INTERPRET=$TEST_INTERPRET \
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
    step tests 30 240 "$PY" -P -m pytest -q -p no:cacheprovider --noconftest \
    -p pytest_timeout -p gpu_suite -o timeout=90 -m "not slow" \
    --junitxml="$JUNIT" -o junit_family=xunit2 \
    tests/unit/executor/test_fp8.py tests/unit/kernels ${EXTRA[@]+"${EXTRA[@]}"}

# 3. kernel benchmarks
step kernels 20 120 "$PY" bench/kernels.py "${KERNEL_ARGS[@]}" --json "$T/kernels.json"

# 4. executor benchmark, in process (no Ray); it starts no configuration after its
# --budget-s (kept 45 s inside the step's timeout: one configuration's longest run) and
# rewrites its JSON after each one.
EXECUTOR_BUDGET=$(($(left_s) < 180 ? $(left_s) - 45 : 135))
[ "$EXECUTOR_BUDGET" -lt 10 ] && EXECUTOR_BUDGET=10
step executor 20 180 "$PY" bench/executor.py --no-ray "${EXECUTOR_ARGS[@]}" \
    --budget-s "$EXECUTOR_BUDGET" --json "$T/executor.json"

# 5. telemetry: stop the sampler (one last sample is in by now)
sleep 1
kill "$TELEMETRY" 2>/dev/null
wait "$TELEMETRY" 2>/dev/null

# 6. merge; should the merge itself fail, a minimal JSON with the steps' records
timeout 60 "$PY" bench/gpu_suite.py merge "$T" "$OUT/gpu_suite.json" --junit "$JUNIT" 2>&1 |
    tee -a "$LOG"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    log "merge failed: writing the step records only"
    {
        printf '{"suite":"bench/gpu_suite.sh","ok":false,"merge_failed":true,"steps":['
        paste -sd, "$T/steps.jsonl" 2>/dev/null
        printf ']}\n'
    } >"$OUT/gpu_suite.json"
fi
log "done in $(($(date +%s) - STARTED))s: $OUT/gpu_suite.json"
rm -rf "$T"
exit 0
