#!/usr/bin/env bash
# The checks that need a GPU, in one short run (at most ~8 minutes on one GPU machine):
#   1. setup      .venv as scripts/setup.sh makes it, but a CUDA build of torch is never replaced: it is
#                 reported first; a CPU build is reported (not replaced either) and the GPU steps then fail;
#   2. gpu_tests  pytest -m gpu (tests marked gpu: autocast training, seq2seq decoding, Triton/AdaSplash kernels);
#   3. scaling    scripts/bench_scaling.py --device cuda --nprocs 1[,2] (one process per GPU, NCCL), few steps;
#   4. train_bf16 a short real run of the CLI on the GPU: alpha-entmax (learned alphas), bf16 autocast;
#   5. bench_*    the benchmark scripts under scripts/ that take --device, with --device cuda in their quick mode
#                 (the others time CPU kernels only and are listed as skipped).
# Every step has its own timeout (clipped to what is left of GPU_CHECK_BUDGET_S, default 470 s), writes under
# ${OUT:-gpu_check_out}/ (<step>.log, the benchmarks' JSON/markdown, junit XML), and a failing step does not stop
# the others. A summary of what passed / failed / was skipped is printed at the end and written to summary.txt;
# the exit status is 1 when a step failed, else 0.
#
#   bash scripts/gpu_check.sh                    # on the GPU machine, from anywhere
#   OUT=/tmp/gc bash scripts/gpu_check.sh        # elsewhere
#   GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh   # list the steps and their commands, run nothing
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) && export OUT
BUDGET=${GPU_CHECK_BUDGET_S:-470}
DRY=${GPU_CHECK_DRY_RUN:-0}
PY=$ROOT/.venv/bin/python
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SPARSE_RUNNER_CACHE=${SPARSE_RUNNER_CACHE:-$OUT/cache}
START=$(date +%s)
SUMMARY=()
FAILED=0

# ------------------------------------------------------------------------------------------------- setup
# Run as `bash scripts/gpu_check.sh __setup` by the setup step (so that it has a timeout of its own).
setup() {
    set -e
    local sys_python=${PYTHON:-python3}
    if [ ! -x "$PY" ]; then
        if "$sys_python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
            echo "setup: $sys_python has a CUDA build of torch: .venv is created with --system-site-packages so that it is kept"
            "$sys_python" -m venv --system-site-packages .venv
        else
            "$sys_python" -m venv .venv
        fi
    fi
    local info
    info=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())' 2>/dev/null || true)
    if [ -z "$info" ]; then
        echo "setup: no torch in .venv: pip install torch==2.13.0 (on Linux x86_64 the PyPI wheel is a CUDA build)"
        "$PY" -m pip install -q torch==2.13.0
        info=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())')
    fi
    read -r version cuda available count <<<"$info"
    if [ "$available" = True ]; then
        echo "setup: torch $version (CUDA $cuda) sees $count GPU(s): kept as it is"
    elif [ "$cuda" = None ]; then
        echo "setup: WARNING: torch $version in .venv is a CPU build; it is NOT replaced. For the GPU steps install your CUDA"
        echo "       build into .venv first, e.g. .venv/bin/pip install --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    else
        echo "setup: WARNING: torch $version is a CUDA $cuda build but sees no GPU (driver? CUDA_VISIBLE_DEVICES?); nvidia-smi says:"
        nvidia-smi -L 2>&1 | head -8 || true
    fi
    # The installed torch pinned exactly (local label included), so that pip can never swap it for another build.
    sed "s/^torch==.*/torch==$version/" constraints.txt >"$OUT/constraints.gpu_check.txt"
    if "$PY" -c 'import sparse_runner, hydra, pytest, entmax' 2>/dev/null; then
        echo "setup: sparse_runner and its dev dependencies are already importable: no pip install"
    else
        "$PY" -m pip install -q -e ".[dev]" -c "$OUT/constraints.gpu_check.txt"
    fi
    if [ "$available" = True ] && ! "$PY" -c 'import triton' 2>/dev/null; then
        echo "setup: triton missing: pip install -e .[gpu] (failure tolerated: the Triton tests then skip)"
        "$PY" -m pip install -q -e ".[gpu]" -c "$OUT/constraints.gpu_check.txt" || echo "setup: WARNING: .[gpu] not installed"
    fi
    "$PY" -c 'import torch, sparse_runner; print("setup: ready: torch", torch.__version__, "cuda", torch.cuda.is_available())'
}
if [ "${1:-}" = __setup ]; then
    setup
    exit
fi

# ------------------------------------------------------------------------------------------------- steps
record() { SUMMARY+=("$(printf '%-26s %-8s %s' "$1" "$2" "$3")"); }

# step NAME LIMIT_S CMD...: run CMD under `timeout`, output to the console and $OUT/NAME.log.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 30 ]; then
        record "$name" SKIP "no time left of GPU_CHECK_BUDGET_S=$BUDGET"
        return
    fi
    [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))
    echo
    echo "=== $name (timeout ${limit}s): $*"
    if [ "$DRY" = 1 ]; then
        record "$name" DRY "$*"
        return
    fi
    local t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]} secs=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        record "$name" PASS "${secs}s"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        record "$name" TIMEOUT "after ${limit}s (log: $OUT/$name.log)"
        FAILED=1
    else
        record "$name" FAIL "exit $rc after ${secs}s (log: $OUT/$name.log)"
        FAILED=1
    fi
}

echo "gpu_check: $(date -u +%FT%TZ), output under $OUT, budget ${BUDGET}s"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | head -8

step setup 150 bash scripts/gpu_check.sh __setup

NGPU=0
if [ -x "$PY" ]; then
    NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
fi
echo "gpu_check: $NGPU GPU(s) visible to .venv's torch"

if [ "$NGPU" -gt 0 ] || [ "$DRY" = 1 ]; then
    step gpu_tests 200 "$PY" -m pytest -q -m gpu -rs --junitxml="$OUT/pytest_gpu.xml" tests/

    NPROCS=1
    [ "$NGPU" -ge 2 ] && NPROCS=1,2
    step scaling 150 "$PY" scripts/bench_scaling.py --device cuda --nprocs "$NPROCS" --max-steps 300 --timeout 120 \
        --out "$OUT/scaling"

    step train_bf16 90 "$PY" -m sparse_runner.cli experiment=lra_listops_cpu model=entmax trainer.device=cuda \
        trainer.precision=bf16 trainer.max_steps=200 trainer.eval_every=100 trainer.progress=false trainer.resume=false \
        paths.output_dir="$OUT/train_bf16"

    for bench in bench_attention bench_normalisers bench_long_attention bench_block_sparse; do
        script=scripts/$bench.py
        if [ ! -f "$script" ]; then
            record "$bench" SKIP "$script not found"
        elif ! grep -q -- '"--device"' "$script"; then
            record "$bench" SKIP "no --device flag: it times CPU kernels only"
        else
            outflag=--out
            grep -q -- '"--out-dir"' "$script" && outflag=--out-dir
            step "$bench" 60 "$PY" "$script" --device cuda --quick "$outflag" "$OUT/$bench"
        fi
    done
else
    for name in gpu_tests scaling train_bf16; do
        record "$name" SKIP "no GPU visible to .venv's torch (see the setup step)"
    done
    FAILED=1
fi

echo
echo "=== gpu_check summary ($(($(date +%s) - START))s; logs and results under $OUT)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
[ -f "$OUT/scaling/bench_scaling.md" ] && { echo; cat "$OUT/scaling/bench_scaling.md"; }
exit "$FAILED"
