#!/usr/bin/env bash
# The GPU validation of issue 8, in stages, on a machine with an NVIDIA GPU and torch installed
# (the device machines: torch 2.11.0+cu130, Python 3.12, no network). Everything it writes goes
# to $OUT (the device tool's output folder) or ./validation-out, at most 8 files:
#
#   bash docs/validation/run-on-gpu.sh scan tests      # report JSON + Markdown, timed; pytest -m gpu
#   bash docs/validation/run-on-gpu.sh drills all bench
#
# Stages: scan, tests, drills, all (--device all and a video-diffusion --attn-shape), bench.
# It never resets the GPU or changes its settings. Wheels for packages the machine lacks
# (xformers, flash-attn) can be carried in .whl/ and are installed into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-validation-out}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# gpudoctor itself: no dependencies fetched (typer, rich, nvidia-ml-py are in the image).
"$py" -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 \
    || { echo "gpudoctor did not install:"; cat "$out/install.log"; exit 1; }
gpudoctor=("$py" -m gpudoctor)
name=$("$py" - <<'PY'
import torch
n = torch.cuda.get_device_name(0).lower() if torch.cuda.is_available() else "nogpu"
gpu = next((g for g in ("h200", "h100", "b200", "a100", "l40s") if g in n), n.replace(" ", "-"))
print(f"{gpu}-torch{torch.__version__.split('+')[0]}")
PY
)
echo "validation: $name"

leftovers() {  # gpudoctor workers or probe children still alive after a command
    ps -eo pid=,args= | grep -E 'gpudoctor|BOOTSTRAP|gpudoctor\.worker' | grep -v -E 'grep|run-on-gpu' || true
}

for stage in "$@"; do
    case $stage in
    scan)
        start=$(date +%s%N)
        "${gpudoctor[@]}" scan --format json -o "$out/$name.json" --markdown "$out/$name.md"
        code=$?
        echo "scan exit $code, wall $(( ($(date +%s%N) - start) / 1000000 )) ms (torch import included)"
        "${gpudoctor[@]}" report "$out/$name.json" -v
        ;;
    tests)
        "$py" -m pytest -q -m gpu -p no:cacheprovider -rs 2>&1 | tail -40
        ;;
    drills)
        files=(tests/fixtures/gpu_drills/*.py)
        args=(); for f in "${files[@]}"; do args+=(--probe-file "$f"); done
        "${gpudoctor[@]}" scan "${args[@]}" --format json -o "$out/drills.json" -v
        echo "drills scan exit $?; processes left:"; leftovers
        "$py" -m pytest -q -p no:cacheprovider tests/test_gpu_drills.py 2>&1 | tail -5
        ;;
    all)
        "${gpudoctor[@]}" scan --device all -q --format json -o "$out/device-all.json"; echo "device all exit $?"
        # Wan2.1-style 720p video: 81 frames -> 21 x 45 x 80 latent patches = 75600 tokens, 40 heads of 128.
        "${gpudoctor[@]}" scan --probe attention-memory --attn-shape 1,40,75600,128 -v
        ;;
    bench)
        "$py" benchmarks/bench_scan.py --rounds 3 --device cuda:0 2>&1 | tail -30
        ;;
    *)
        echo "unknown stage $stage (scan, tests, drills, all, bench)"; exit 2
        ;;
    esac
done
echo "processes left at the end:"; leftovers
