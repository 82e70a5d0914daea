#!/usr/bin/env bash
# The checks that need a GPU, in one run of at most ~8 minutes on one GPU machine, network or not:
#   1. setup          the interpreter (`choose_python`): $PYTHON (default python3) as it is when it imports torch
#                     and sees a CUDA device (a CUDA image's own venv: no new venv, which would lose its torch);
#                     the project's pure-Python dependencies it lacks come from the wheel folder .whl/ (the wheels
#                     of $DISTRIBUTIONS, fetched where there is network with `pip wheel --no-deps -w .whl` and
#                     copied along) with `pip install --no-index --target`, or from the package index when one
#                     answers; never a download attempt offline. Without such an interpreter: .venv, as scripts/setup.sh makes it (network only).
#   2. gpu_tests      pytest -m "gpu and not slow" (autocast training, decoding, the Triton/AdaSplash kernels; the
#                     compiled-model tests, gpu and slow, need `bash scripts/test.sh -m gpu`);
#   3. bench_layers   scripts/bench_long_attention.py --device cuda: the layer table (ms and peak memory per row and N);
#   4. bench_blocks   scripts/bench_block_sparse.py --device cuda: BigBird and HST softmax through the tiles and through
#                     FlexAttention (model.attention_impl=flex) beside dense SDPA, at 64k then 16k tokens (and HST at
#                     block 63, whose tiles are 64 positions, not 65: what the odd tile costs); with
#                     GPU_CHECK_BUDGET_S >= 900 also through torch.compile (and CUDA graphs), and step 5 ERNIE-Sparse compiled;
#   5. bench_training scripts/bench_training.py --device cuda: tokens/s and peak memory per model on lra_listops, bf16;
#   6. bench_presets  scripts/bench_presets.py --device cuda: seconds per step and GPU-hours of every paper preset.
# Every step runs under `timeout` (its share of GPU_CHECK_BUDGET_S, default 470 s, clipped to what is left); the
# benchmarks get two thirds of it as their --time-budget and rewrite their tables as they go, so a late cell is
# "n/a (time budget spent)", never a lost table. Everything goes under ${OUT:-gpu_check_out}/: <step>.log,
# bench/*.json and *.md, pytest_gpu.xml, summary.txt, summary.json and gpu_check.md (the summary and the tables).
# Exit status: 0 when every step passed (a peer that is not installed is a table cell, not a failure), 1 when a
# GPU test or a step failed or timed out, 3 when no interpreter sees a CUDA device (nothing was checked).
#
#   bash scripts/gpu_check.sh                    # on the GPU machine, from anywhere
#   OUT=/tmp/gc bash scripts/gpu_check.sh        # elsewhere
#   bash scripts/gpu_check.sh --dry-run          # the interpreter and every step's command, nothing run
#   bash scripts/gpu_check.sh --which-python     # "<cuda|venv> <interpreter>": what the checks would run with
# Environment: PYTHON (the interpreter to try first), GPU_CHECK_BUDGET_S, GPU_CHECK_WHEELS (default .whl),
# GPU_CHECK_SITE (where the wheels are installed, default $TMPDIR/sparse_runner_gpu_check_site), GPU_CHECK_OFFLINE=1
# (take the index as unreachable without asking).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=${GPU_CHECK_DRY_RUN:-0}
case "${1:-}" in
    "") ;;
    --dry-run) DRY=1 ;;
    --which-python | __setup) ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'; valid: --dry-run, --which-python, --help" >&2; exit 2 ;;
esac
DEFAULT_BUDGET=470
BUDGET=${GPU_CHECK_BUDGET_S:-$DEFAULT_BUDGET}
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
SITE=${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/sparse_runner_gpu_check_site}
# What the project imports beyond torch, triton, transformers, pytest, numpy and the like, which a CUDA image's
# interpreter holds, and the distributions that carry them (adasplash is an optional peer).
NEEDED_MODULES="hydra omegaconf antlr4 datasets dill multiprocess sacremoses entmax submitit"
DISTRIBUTIONS="hydra-core omegaconf antlr4-python3-runtime sacremoses entmax dill multiprocess datasets submitit adasplash"
CUDA_PROBE='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'

# "cuda <path>" when $PYTHON (default python3) imports torch and sees a CUDA device: the checks use it as it
# is. Otherwise "venv <ROOT>/.venv/bin/python".
choose_python() {
    local path
    path=$(command -v "${PYTHON:-python3}" 2>/dev/null) || path=
    if [ -n "$path" ] && "$path" -c "$CUDA_PROBE" >/dev/null 2>&1; then
        echo "cuda $path"
    else
        echo "venv $ROOT/.venv/bin/python"
    fi
}

# Whether a package index answers within 5 s ($PIP_INDEX_URL, else PyPI); GPU_CHECK_OFFLINE=1: no, unasked.
index_reachable() {
    [ "${GPU_CHECK_OFFLINE:-0}" = 1 ] && return 1
    "${1:-python3}" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
        "${PIP_INDEX_URL:-https://pypi.org/simple/}" >/dev/null 2>&1
}

read -r MODE PY <<<"$(choose_python)"
if [ "${1:-}" = --which-python ]; then
    echo "$MODE $PY"
    exit 0
fi

# ------------------------------------------------------------------------------------------------- setup
# Run as `bash scripts/gpu_check.sh __setup` by the setup step (so that it has a timeout of its own).
missing_modules() {  # the NEEDED_MODULES that $PY cannot import (with PYTHONPATH as exported)
    "$PY" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' $NEEDED_MODULES
}

setup_cuda_interpreter() {
    echo "setup: $PY imports torch $("$PY" -c 'import torch; print(torch.__version__, "with CUDA", torch.version.cuda)') and sees a GPU: used as it is, no venv"
    local missing
    missing=$(missing_modules)
    if [ -z "$missing" ]; then
        echo "setup: every dependency is importable: nothing installed"
    elif compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "setup: missing $missing: installing the wheels of $WHEELS into $SITE (no index)"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    elif index_reachable "$PY"; then
        echo "setup: missing $missing: installing $DISTRIBUTIONS into $SITE from the package index (no dependencies: torch stays)"
        "$PY" -m pip install -q --no-deps --no-compile --upgrade --target "$SITE" -c constraints.txt $DISTRIBUTIONS
    else
        echo "setup: missing $missing, no package index reachable and no wheels in $WHEELS: fetch them where there is" \
            "network ('pip wheel --no-deps -w .whl $DISTRIBUTIONS') and copy .whl/ along"
        return 1
    fi
    missing=$(missing_modules)
    [ -z "$missing" ] || { echo "setup: still missing after the install: $missing"; return 1; }
}

setup_venv() {
    echo "setup: ${PYTHON:-python3} does not see a CUDA device through torch: .venv ($PY)"
    if [ ! -x "$PY" ] || ! "$PY" -c 'import torch, sparse_runner, hydra, pytest, entmax' 2>/dev/null; then
        if ! index_reachable "${PYTHON:-python3}"; then
            echo "setup: .venv is missing or incomplete and no package index is reachable: nothing installed"
            return 1
        fi
        [ -x "$PY" ] || "${PYTHON:-python3}" -m venv .venv
        "$PY" -m pip install -q -e ".[dev,gpu]" -c constraints.txt
    fi
    "$PY" -c 'import torch; print("setup: torch", torch.__version__, "CUDA build" if torch.version.cuda else "CPU build", "sees", torch.cuda.device_count(), "GPU(s)")'
}

export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "${1:-}" = __setup ]; then
    set -e
    if [ "$MODE" = cuda ]; then setup_cuda_interpreter; else setup_venv; fi
    exit
fi

# ------------------------------------------------------------------------------------------------- steps
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT/bench" && OUT=$(cd "$OUT" && pwd) && export OUT
export SPARSE_RUNNER_CACHE=${SPARSE_RUNNER_CACHE:-$OUT/cache} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
START=$(date +%s)
SUMMARY=()
STEPS_JSON=()
FAILED=0

record() {
    SUMMARY+=("$(printf '%-16s %-8s %s' "$1" "$2" "$3")")
    local detail=${3//\\/\\\\}
    STEPS_JSON+=("{\"step\": \"$1\", \"status\": \"$2\", \"detail\": \"${detail//\"/\\\"}\"}")
}

# step NAME LIMIT_S CMD...: CMD under `timeout`, to the console and $OUT/NAME.log. LIMIT_S is the step's share of
# the default budget, scaled to GPU_CHECK_BUDGET_S and clipped to what is left; an argument {budget} becomes two
# thirds of it (the benchmarks' --time-budget).
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 30 ]; then
        record "$name" SKIP "no time left of GPU_CHECK_BUDGET_S=$BUDGET"
        return
    fi
    limit=$((limit * BUDGET / DEFAULT_BUDGET))  # the shares are those of the default budget
    [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))
    local args=() arg
    for arg in "$@"; do args+=("${arg//\{budget\}/$((limit * 2 / 3))}"); done
    local shown=""  # the command as a shell reads it back: an argument with spaces quoted (-m 'gpu and not slow')
    for arg in "${args[@]}"; do
        if [[ $arg == *" "* ]]; then shown+=" '$arg'"; else shown+=" $arg"; fi
    done
    shown=${shown# }
    echo
    echo "=== $name (timeout ${limit}s): $shown"
    if [ "$DRY" = 1 ]; then
        record "$name" DRY "$shown"
        return
    fi
    local t0 rc secs
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "${args[@]}" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]} secs=$(($(date +%s) - t0))
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

echo "gpu_check: $(date -u +%FT%TZ), output under $OUT, budget ${BUDGET}s, interpreter $PY ($MODE)"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | head -8

step setup 45 bash scripts/gpu_check.sh __setup

NGPU=0
if [ "$DRY" != 1 ] && [ -x "$PY" ]; then
    NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
    echo "gpu_check: $NGPU GPU(s) visible to $PY"
fi

GPU_STEPS="gpu_tests bench_layers bench_blocks bench_training bench_presets"
LAYER_ROWS=sdpa_softmax,triton_alpha_entmax,triton_entmax15,triton_entmax15_general,triton_alpha_entmax_all_tiles,adasplash_entmax15,hst_softmax,hst_alpha_entmax,bigbird_softmax
BLOCK_ROWS=dense_sdpa,bigbird_softmax,bigbird_softmax_flex,hst_softmax,hst_softmax_flex,hst_softmax_block63
TRAINING_MODELS=softmax,bigbird,ernie_sparse,entmax15,entmax
# torch.compile's rows compile for a minute or so each, which a step's share of the default budget cannot hold
# (a cell started before the step's --time-budget runs on to its timeout): only with a budget of 900 s or more.
if [ "$BUDGET" -ge 900 ]; then
    BLOCK_ROWS+=,hst_softmax_compiled,bigbird_softmax_compiled,hst_softmax_cudagraphs
    TRAINING_MODELS+=,ernie_sparse+trainer.compile=true
fi
if [ "$NGPU" -gt 0 ] || [ "$DRY" = 1 ]; then
    # Shares (seconds of the default budget, 465 of 470 in all). bench_blocks: the longest length first, where the
    # targets are strictest; each FlexAttention row compiles in its first call of a length (seconds in the table).
    step gpu_tests 175 "$PY" -m pytest -q -m "gpu and not slow" -rs -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml" tests/
    # bench_layers: the Triton kernel with and without each lever, its peers and the block layers, 4k first (the
    # issue's targets start there); the other rows (torch paths, entmax_bisect, HF BigBird) by the script alone.
    step bench_layers 75 "$PY" scripts/bench_long_attention.py --device cuda --time-budget {budget} --out-dir "$OUT/bench" \
        --shapes 4096:4,16384:1,1024:16,65536:1 --rows "$LAYER_ROWS"
    step bench_blocks 70 "$PY" scripts/bench_block_sparse.py --device cuda --time-budget {budget} --out-dir "$OUT/bench" \
        --lengths 65536,16384 --rows "$BLOCK_ROWS"
    step bench_training 50 "$PY" scripts/bench_training.py --device cuda --time-budget {budget} --out "$OUT/bench" --models "$TRAINING_MODELS"
    step bench_presets 50 "$PY" scripts/bench_presets.py --device cuda --time-budget {budget} --out "$OUT/bench" \
        --overrides trainer.precision=bf16
else
    for name in $GPU_STEPS; do
        record "$name" SKIP "no GPU visible to $PY (see the setup step)"
    done
    FAILED=3
fi

SECONDS_TOTAL=$(($(date +%s) - START))
echo
echo "=== gpu_check summary (${SECONDS_TOTAL}s; logs and results under $OUT)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
{
    printf '{"interpreter": "%s", "mode": "%s", "gpus": %s, "seconds": %s, "exit_status": %s, "steps": [\n' "$PY" "$MODE" "$NGPU" "$SECONDS_TOTAL" "$FAILED"
    (IFS=$'\n'; echo "${STEPS_JSON[*]}") | sed '$!s/$/,/'
    echo "]}"
} >"$OUT/summary.json"
{
    echo "# GPU check ($(date -u +%FT%TZ), ${SECONDS_TOTAL}s, interpreter $PY)"
    echo
    echo '```'
    printf '%s\n' "${SUMMARY[@]}"
    echo '```'
    for table in long_attention_cuda block_sparse_cuda training_cuda presets_cuda; do
        [ -f "$OUT/bench/$table.md" ] && { echo; cat "$OUT/bench/$table.md"; }
    done
} >"$OUT/gpu_check.md"
exit "$FAILED"
