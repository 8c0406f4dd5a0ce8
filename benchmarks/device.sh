#!/usr/bin/env bash
# A GPU run in one script: CUDA tests, the 124M shape's training tokens/s and MFU (AdamW and
# Muon compiled, with dynamo's graph breaks and recompiles; AdamW eager once), the speedrun
# recipe's cold compile, generation tokens/s with and without the KV cache, and the peak memory
# of each; one report. The parts and their time caps are benchmarks/device.py's; the default
# run fits in 5 minutes (280 s of parts, BUDGET_S), set-up included, so that a rerun fits in the
# device time a task is lent.
#
#   bash benchmarks/device.sh prepare              # here, once, with PyPI: fills .carry/ (ignored by git)
#   bash benchmarks/device.sh                      # there: the device tool's run, carry [".carry"]
#   DEVICE=cpu SMOKE=1 bash benchmarks/device.sh   # anywhere: the plumbing, tiny sizes (~1 min on 2 cores)
#   BUDGET_S=120 bash benchmarks/device.sh         # seconds for all parts; what does not fit is skipped and listed
#   PARTS=fsdp,baby_gpt bash benchmarks/device.sh  # some parts (benchmarks/device.py --parts), these two only on request
#
# The device machine reaches no network and its image lacks hydra-core, omegaconf,
# antlr4-python3-runtime and datasets (and datasets' dill and multiprocess): `prepare` downloads
# them as wheels for its Python 3.12 (the versions this checkout's environment has; antlr4 4.9.3
# is built here, PyPI has no wheel of it) into .carry/wheels, and copies the shared Tiny
# Shakespeare and GPT-2's BPE ranks into .carry/shared/data (../shared does not travel with the
# working tree; .carry does when the run names it in `carry`). The run installs the wheels with
# --no-deps into a folder of its own on PYTHONPATH (nothing of the image is replaced) when a
# package is missing, seeds a data root with Tiny Shakespeare, points the tests' shared data at
# .carry/shared, and runs benchmarks/device.py.
#
# Writes $OUT/device_report.md and $OUT/device_report.json (every figure and command), the
# parts' output in $OUT/device_log.txt and the set-up's in $OUT/device_setup.txt. $OUT is the
# device tool's folder there; elsewhere it defaults to outputs/device. The report is written at
# the start and after every part; a part that fails is recorded and the next one runs; a SIGTERM
# to this script stops the part running and leaves the report of what ran. The script exits 0
# once the report is written (143 after a SIGTERM). The checkout runs uninstalled: its root is
# put first on PYTHONPATH (the device image has torch, not tinygpt).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CARRY=${CARRY_DIR:-.carry}
PACKAGES="hydra-core omegaconf antlr4-python3-runtime datasets dill multiprocess"

if [ "${1:-run}" = prepare ]; then
    set -e
    mkdir -p "$CARRY/wheels" "$CARRY/shared/data/tinyshakespeare" "$CARRY/shared/data/tiktoken"
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/$CARRY/" "$exclude" 2>/dev/null || echo "/$CARRY/" >>"$exclude"
    pins=()
    for p in $PACKAGES; do  # this environment's versions: the ones the tests ran with
        v=$($PY -c "import importlib.metadata as m; print(m.version('$p'))" 2>/dev/null || true)
        # unpinned, pip would take the newest of each, which need not fit together (hydra-core
        # 1.3 with antlr4 4.13 fails at import: "Could not deserialize ATN with version 3")
        [ -n "$v" ] || { echo "error: $p is not installed for $PY; run prepare with the project's environment (PYTHON=path/to/venv/bin/python)" >&2; exit 1; }
        pins+=("$p==$v")
    done
    rm -f "$CARRY"/wheels/*.whl
    binary=()
    for spec in "${pins[@]}"; do [[ $spec == antlr4-python3-runtime* ]] || binary+=("$spec"); done
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/wheels" "${binary[@]}"
    for spec in "${pins[@]}"; do  # an sdist only on PyPI: a pure-Python wheel built here
        [[ $spec == antlr4-python3-runtime* ]] && $PY -m pip wheel -q --no-deps -w "$CARRY/wheels" "$spec"
    done
    shared=${TINYGPT_TEST_SHARED:-../shared}
    cp "$shared/data/tinyshakespeare/input.txt" "$CARRY/shared/data/tinyshakespeare/input.txt"
    cp "$shared/data/tiktoken/r50k_base.tiktoken" "$CARRY/shared/data/tiktoken/r50k_base.tiktoken"
    ls -l "$CARRY/wheels"
    du -sh "$CARRY"
    echo "ready: run bash benchmarks/device.sh on the device with carry [\"$CARRY\"]"
    exit 0
fi

OUT=${OUT:-outputs/device}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export HF_HUB_OFFLINE=1  # no network there: fail at once instead of waiting on the Hub
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's gpt, installed or not
SETUP=()
{
    echo "$(date -u) $(hostname) $($PY --version 2>&1)"
    if ! $PY -c "import hydra, omegaconf, antlr4, datasets, dill, multiprocess" 2>/dev/null; then
        if ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
            site=${TMPDIR:-/tmp}/tinygpt-site
            if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$CARRY"/wheels/*.whl; then
                export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
                SETUP+=("installed $(ls "$CARRY"/wheels | tr '\n' ' ')into $site")
            else
                SETUP+=("pip install of $CARRY/wheels failed (see device_setup.txt)")
            fi
        else
            SETUP+=("packages missing and no wheels in $CARRY/wheels: run 'bash benchmarks/device.sh prepare' here first")
        fi
    else
        SETUP+=("every package present; nothing installed")
    fi
    $PY -c "import hydra, omegaconf, datasets; print('hydra', hydra.__version__, 'omegaconf', omegaconf.__version__, 'datasets', datasets.__version__)" 2>&1 || true
} >"$OUT/device_setup.txt" 2>&1

# Tests read the shared data from TINYGPT_TEST_SHARED; runs from a data root holding Tiny Shakespeare.
if [ -z "${TINYGPT_TEST_SHARED:-}" ] && [ -d "$CARRY/shared/data" ]; then
    export TINYGPT_TEST_SHARED=$PWD/$CARRY/shared
fi
if [ -z "${TINYGPT_DATA_DIR:-}" ]; then
    export TINYGPT_DATA_DIR=${TMPDIR:-/tmp}/tinygpt-device-data
fi
text=$TINYGPT_DATA_DIR/tinyshakespeare/input.txt
if [ ! -f "$text" ]; then
    for source in "${TINYGPT_TEST_SHARED:-../shared}/data/tinyshakespeare/input.txt" "$CARRY/shared/data/tinyshakespeare/input.txt"; do
        if [ -f "$source" ]; then
            mkdir -p "$(dirname "$text")" && cp "$source" "$text" && break
        fi
    done
fi
[ -f "$text" ] && SETUP+=("data root $TINYGPT_DATA_DIR") || SETUP+=("no Tiny Shakespeare found for $TINYGPT_DATA_DIR (the baby GPT will try to download it)")

DEVICE_SETUP=$(printf "%s; " "${SETUP[@]}")
export DEVICE_SETUP=${DEVICE_SETUP%; }
args=(--out "$OUT" --device "${DEVICE:-cuda}")
[ "${SMOKE:-0}" = 1 ] && args+=(--smoke)
[ -n "${PARTS:-}" ] && args+=(--parts "$PARTS")  # some parts, e.g. PARTS=cuda_tests,generation
[ -n "${BUDGET_S:-}" ] && args+=(--budget "$BUDGET_S")
# In the background, so that a SIGTERM to this script reaches device.py (bash would wait for it
# to end first), which stops its part and writes the report.
$PY benchmarks/device.py "${args[@]}" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT
wait $child
rc=$?
if kill -0 $child 2>/dev/null; then  # wait returned for the signal: the report is being written
    wait $child
    rc=$?
fi
cat "$OUT/device_report.md" 2>/dev/null | head -60
exit $rc
