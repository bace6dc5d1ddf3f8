"""GPU010 (allocator-mismatch): custom allocator: size not a multiple of the alignment, or freed with the wrong function.

Its documentation (what `gpudoctor explain GPU010` prints, and its row in docs/lint.md) and its
prefilter, as data. Its check: gpudoctor.lint.cppalloc, called by gpudoctor.lint.cpprules on each
C++/CUDA file.
"""
from __future__ import annotations

from gpudoctor.lint.rules import CPP, Rule

# The rule judges PyTorch backend and allocator code, not any C program (a C library's own
# aligned_alloc wrapper forwards its caller's size): a file without one of these is not judged.
# The same gate as the prefilter's last group, applied by the check too (cpprules.applicable), so
# that the prefilters only save time and never decide a finding.
BACKEND_CODE = (b"c10/", b"ATen/", b"torch/", b"DataPtr", b"PrivateUse1", b"privateuseone", b"Allocator")

RULE = Rule(
    code="GPU010",
    name="allocator-mismatch",
    kb_id="custom-allocator",
    title="custom allocator: size not a multiple of the alignment, or freed with the wrong function",
    kinds=(CPP,),
    # (alloc / Alloc / memalign: a gate implied by the next group, three scans instead of ten
    # for the many headers that allocate nothing)
    prefilter=((b"alloc", b"Alloc", b"memalign"),
               (b"aligned_alloc", b"_aligned_malloc", b"posix_memalign", b"memalign(", b"malloc(", b"calloc(",
                b"cudaMalloc", b"cudaHostAlloc", b"hipMalloc", b"alloc_cpu("),
               (b"free", b"Free", b"deleter", b"aligned_alloc"),
               BACKEND_CODE),
    what=(
        "aligned_alloc(alignment, size) where size is not provably a multiple of alignment; memory "
        "from _aligned_malloc released with free (or malloc'd memory with _aligned_free, new with "
        "free, cudaMalloc with free, ...); a c10::Allocator whose allocate() and deleter use "
        "different allocation families (DataPtr{ptr, ctx, &free, device} for _aligned_malloc memory)."
    ),
    why=(
        "aligned_alloc requires size to be a multiple of alignment (C11/C++17; some C libraries "
        "return NULL, others misbehave). Freeing memory with a function from another family "
        "corrupts the heap or crashes later, far from the bug, and PyTorch trusts an allocator "
        "completely: the DataPtr's deleter is the only thing that frees a tensor's storage."
    ),
    example="void* data = aligned_alloc(64, nbytes);\n...\nvoid* p = _aligned_malloc(n, 64);\nfree(p);",
    fix=(
        "Round the size up: aligned_alloc(64, (nbytes + 63) / 64 * 64); free with the matching "
        "function (_aligned_free, cudaFree, delete[]); or use c10::alloc_cpu / c10::free_cpu "
        "(64-byte aligned, PyTorch's own)."
    ),
    fix_safety="display-only: an allocator change affects every tensor of the backend; review and test it.",
    near_misses=(
        "Sizes rounded up in the same function ((n + 63) / 64 * 64, & ~63, an align/round helper), "
        "checked with %, or literal multiples; allocation and release from the same family do not fire."
    ),
)
