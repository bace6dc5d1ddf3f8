#!/usr/bin/env bash
# The GPU validation of issue 8, in stages, on a machine with an NVIDIA GPU and torch installed
# (the device machines: torch 2.11.0+cu130, Python 3.12, no network). Everything it writes goes
# to $OUT (the device tool's output folder) or ./validation-out, at most 8 files:
#
#   bash docs/validation/run-on-gpu.sh scan tests      # report JSON + Markdown, timed; pytest -m gpu
#   bash docs/validation/run-on-gpu.sh drills all bench
#   bash docs/validation/run-on-gpu.sh fa4             # flash-attn probe alone with FlashAttention-4
#
# Stages: scan (the default quick level), deep (--level deep, diffed with scan's report), tests,
# drills, all (--device all and a video-diffusion --attn-shape), bench, fa4.
# It never resets the GPU or changes its settings. Wheels for packages the machine lacks
# (xformers, flash-attn) can be carried in .whl/ and are installed into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-validation-out}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

# A wheel over one call's carry limit comes split (`split -b 40M x.whl x.whl.part-`), its parts in
# .whl/<folder>/ over consecutive calls: join them, and check them against .whl/*/SHA256SUMS.
mkdir -p /tmp/joined
for first in .whl/*/*.whl.part-aa .whl/*.whl.part-aa; do
    [ -e "$first" ] || continue
    whl=$(basename "${first%.part-aa}")
    # In the order of the parts' suffixes (aa, ab, ac...), whichever folder each came in.
    cat $(ls .whl/*/"$whl".part-* .whl/"$whl".part-* 2>/dev/null | awk -F'.part-' '{print $NF, $0}' | sort | cut -d' ' -f2-) \
        >"/tmp/joined/$whl"
done
for sums in .whl/*/SHA256SUMS .whl/SHA256SUMS; do
    [ -e "$sums" ] || continue
    (cd /tmp/joined && grep -F -f <(ls) "$OLDPWD/$sums" | sha256sum -c --quiet) \
        || { echo "a joined wheel does not match $sums: carry its parts again"; exit 1; }
done
wheels=$(ls .whl/*.whl .whl/*/*.whl /tmp/joined/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    # --target does not read .pth files: nvidia-cutlass-dsl's puts its `cutlass` package on sys.path.
    if [ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ]; then
        export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    fi
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
    deep)
        # The full matrices (issue 18): run after `scan` on the same machine, then compare verdicts.
        start=$(date +%s%N)
        "${gpudoctor[@]}" scan --level deep --format json -o "$out/$name-deep.json" --markdown "$out/$name-deep.md"
        code=$?
        echo "deep scan exit $code, wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
        "${gpudoctor[@]}" diff "$out/$name.json" "$out/$name-deep.json"
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
        "$py" benchmarks/bench_scan.py --rounds 3 --device cuda:0 --level both 2>&1 | tail -40
        ;;
    fa4)
        # FlashAttention-4 (flash-attn-4 and its CuTe DSL runtime, carried in .whl/): its import,
        # then the flash-attn probe alone, twice with FA4's disk cache of compiled kernels
        # (a cold cache compiles, the second run loads) and once as users run it (no disk cache).
        "$py" - <<'PY'
import importlib.metadata as md, time
for dist in ("flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "quack-kernels", "apache-tvm-ffi"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist} not installed")
start = time.perf_counter()
try:
    import flash_attn.cute  # noqa: F401
    print(f"import flash_attn.cute: {time.perf_counter() - start:.2f} s")
except Exception as exc:  # what the probe will report as its finding
    print(f"import flash_attn.cute failed: {type(exc).__name__}: {exc}")
PY
        for run in nocache cache-cold cache-warm; do
            case $run in
            nocache) unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED ;;
            *) export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-cache ;;
            esac
            [ "$run" = cache-cold ] && rm -rf /tmp/fa4-cache
            start=$(date +%s%N)
            "${gpudoctor[@]}" scan --probe flash-attn --format json -o "$out/$name-fa4-$run.json" -q
            echo "fa4 $run: scan exit $?, wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
        done
        unset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED FLASH_ATTENTION_CUTE_DSL_CACHE_DIR
        "${gpudoctor[@]}" report "$out/$name-fa4-nocache.json" -v
        # SDPA's backends on the probe's shape, (B, H, N, D) = (2, 4, 128, d), forward only, for
        # the comparison with FA4's kernel_ms.
        "$py" - <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
for dtype in (torch.float16, torch.bfloat16):
    for d in (64, 128, 256):
        q = torch.randn(2, 4, 128, d, device="cuda", dtype=dtype)
        row = []
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    for _ in range(3):
                        F.scaled_dot_product_attention(q, q, q)
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(20):
                        F.scaled_dot_product_attention(q, q, q)
                    end.record()
                    torch.cuda.synchronize()
                row.append(f"{backend.name} {start.elapsed_time(end) / 20:.3f} ms")
            except RuntimeError as exc:
                row.append(f"{backend.name} refused ({str(exc).splitlines()[0][:60]})")
        print(f"sdpa {str(dtype)[6:]}/d{d}: " + ", ".join(row))
PY
        ;;
    *)
        echo "unknown stage $stage (scan, deep, tests, drills, all, bench, fa4)"; exit 2
        ;;
    esac
done
echo "processes left at the end:"; leftovers
