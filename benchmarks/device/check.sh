#!/usr/bin/env bash
# The GPU check: parity, training MFU, continuous-batching generation and the addition
# demo on one accelerator, as JSON lines in OUT/check.jsonl (benchmarks/device/check.py
# says what each figure is). Under 9 minutes on one H100.
#
#   bash benchmarks/device/check.sh OUT [--tiny] [check.py options]
#
# --tiny: the same code at tiny shapes on whatever JAX finds (about a minute on a CPU;
# tests/test_device_check.py runs it in the default suite).
#
# An air-gapped GPU machine whose Python (3.12) has JAX with CUDA, optax, pyarrow,
# pluggy, msgpack, numpy, rich, matplotlib, tokenizers and safetensors but not
# dm-haiku, jmp, zstandard or structlog: carry their wheels in benchmarks/device/wheels/
# (ignored by git), downloaded on a machine with PyPI access, from the repository root:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d benchmarks/device/wheels dm-haiku==0.0.17 jmp==0.0.4 zstandard==0.25.0 structlog==26.1.0
#
# This script installs whatever of those its Python lacks from that folder (never
# from the network), then the project's own packages without dependencies, both into
# a folder under $TMPDIR put first on PYTHONPATH; the machine's site-packages are
# left as they are.
set -euo pipefail

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: bash benchmarks/device/check.sh OUT [--tiny] [check.py options]" >&2
    exit 2
fi
OUT=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
WHEELS=${STAR_CHECK_WHEELS:-$HERE/wheels}  # the folder of carried wheels
export PYTHONUNBUFFERED=1

# The project's import names, and each distribution that one of them needs.
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"haiku": "dm_haiku", "jmp": "jmp", "zstandard": "zstandard", "structlog": "structlog"}
print(" ".join(w for m, w in need.items() if importlib.util.find_spec(m) is None))
EOF
)
have_project=$("$PY" -c 'import importlib.util as u; print(int(all(u.find_spec(m) for m in ("star_engine", "star_haiku_xmap", "star_arithmetic", "star_filters", "star_schedules", "star_samplers"))))')

if [ -n "$missing" ] || [ "$have_project" = 0 ]; then
    SITE=${TMPDIR:-/tmp}/star-engine-check-site
    rm -rf "$SITE"
    mkdir -p "$SITE"
    if [ -n "$missing" ]; then
        wheels=()
        for w in $missing; do
            found=$(ls "$WHEELS"/"$w"-*.whl 2>/dev/null | head -n 1 || true)
            if [ -z "$found" ]; then
                echo "check.sh: $w is not installed and no wheel of it is in $WHEELS (see this script's header)" >&2
                exit 2
            fi
            wheels+=("$found")
        done
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}"
    fi
    if [ "$have_project" = 0 ]; then
        # The core and the packages the addition demo uses, without dependencies: entry
        # points need installed metadata (a wheel built here, no network).
        "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" \
            "$ROOT" "$ROOT/backends/haiku_xmap" "$ROOT/plugins/arithmetic" "$ROOT/plugins/filters" \
            "$ROOT/plugins/schedules" "$ROOT/plugins/samplers"
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

exec "$PY" "$HERE/check.py" "$OUT" "$@"
