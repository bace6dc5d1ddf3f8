"""GPU006 (no-kernel-for-newer-gpus): CUDA build flags leave newer GPUs without a kernel (no PTX).

Its documentation (what `gpudoctor explain GPU006` prints, and its row in docs/lint.md) and its
prefilter, as data; and its check: in Python files `check` (called by gpudoctor.lint.pyrules),
which reads setup.py and cpp_extension calls with gpudoctor.lint.pyarch; in build files (CMake,
Makefiles, shell scripts, Dockerfiles, cog.yaml) gpudoctor.lint.buildflags, which the engine calls;
gpudoctor.lint.archflags judges the flags both find.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.lint.rules import BUILD, PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.model import Finding
    from gpudoctor.lint.pyrules import Facts
    from gpudoctor.lint.pysource import PySource

RULE = Rule(
    code="GPU006",
    name="no-kernel-for-newer-gpus",
    kb_id="no-kernel-image",
    title="CUDA build flags leave newer GPUs without a kernel (no PTX)",
    kinds=(PYTHON, BUILD),
    prefilter=((b"-arch", b"gencode", b"generate-code", b"arch=compute_", b"ARCH_LIST", b"CUDA_ARCHITECTURES",
                b"gpu-architecture", b"-code"),),
    # (a flag starts a word: not "multi-arch " or "# mypy: disable-error-code="; the byte before it
    # is checked by a lookbehind at the end, so that the regex starts with a literal and the engine
    # skips to it, many times faster than trying a character class at every position)
    pattern=((rb"-arch[= \"'](?<=[\s\"'\[(,=]-arch[= \"'])", rb"--gpu-architecture", rb"-gencode", rb"--generate-code",
              rb"arch=compute_", rb"TORCH_CUDA_ARCH_LIST", rb"CUDA_ARCHITECTURES", rb"-code[= ](?<=[\s\"'\[(,=]-code[= ])"),),
    what=(
        "nvcc flags (-arch / -code / -gencode / --gpu-architecture in extra_cuda_cflags, "
        "extra_compile_args, CMake flags, Makefiles and shell commands), TORCH_CUDA_ARCH_LIST or "
        "CMAKE_CUDA_ARCHITECTURES values after which a GPU in use today that is newer than the "
        "build's newest target (H100 sm_90, B200 sm_100, B300 sm_103, RTX 50xx sm_120, DGX Spark "
        "sm_121) gets no kernel: no SASS that fits and no PTX to JIT-compile. Flags are collected "
        "per list (including later appends), per CMake/Make file and per nvcc command."
    ),
    why=(
        "SASS for sm_XY runs only on GPUs of the same major version with minor >= Y; PTX runs on "
        "its own architecture and every newer one; arch-specific code (sm_90a, sm_100a) runs on "
        "exactly one compute capability and family code (sm_100f) within its major version. "
        "`-gencode arch=compute_86,code=sm_86`, TORCH_CUDA_ARCH_LIST=\"8.6\" or \"7.0;8.0;8.6\", "
        "CMake's \"86-real\" and `-gencode arch=compute_90a,code=sm_90a` embed no PTX that a newer "
        "GPU can use, so an H100, B200 or RTX 5090 gets 'no kernel image is available for "
        "execution on the device' at the first launch. A lone -arch=sm_86 is not this case: nvcc "
        "adds compute_86 PTX to it, which newer GPUs JIT-compile."
    ),
    example='extra_cuda_cflags=["-gencode", "arch=compute_86,code=sm_86"]\nexport TORCH_CUDA_ARCH_LIST="7.0;8.0;8.6"',
    fix=(
        'Add PTX for the newest target ("8.6" -> "8.6+PTX", code=sm_86 -> code=[sm_86,compute_86], '
        'CMake "86-real" -> "86"), or list every GPU family you run on plus PTX for the newest: '
        'TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0;10.0;12.0+PTX".'
    ),
    fix_safety=(
        "safe: where the fix only adds PTX to the newest generic target (\"8.6\" -> \"8.6+PTX\", "
        "code=sm_86 -> code=[sm_86,compute_86], \"86-real\" -> \"86\") the same SASS is built, plus "
        "PTX that newer GPUs JIT-compile at first launch. Builds whose newest targets are "
        "arch-specific get a display-only fix: their kernels may need those features, so only the "
        "author can choose a generic target or a build per GPU family."
    ),
    near_misses=(
        "A lone -arch=sm_XY (its PTX runs on newer GPUs), any list with PTX of a generic target "
        "(+PTX, code=compute_XY, CMake \"86\", nvcc 13.0's -arch=sm_90a), lists that reach the "
        "newest family (\"8.0;9.0;10.0;12.0\"), builds that leave out only older GPUs or gaps "
        "between their targets (\"12.0\", \"8.0;12.0\"), family targets of the newest family "
        "(sm_120f), -arch=native/all, named architectures (Ampere), several alternative "
        "TORCH_CUDA_ARCH_LIST values in one file (unless picked by the CUDA toolkit's version alone, "
        "as cross-compile defaults are: then each is judged), and flags built from variables do not "
        "fire; a list name concatenated into the flags counts with the literal words and appends it "
        "has at that point."
    ),
)


def check(src: PySource, facts: Facts | None = None) -> list[Finding]:
    from gpudoctor.lint.pyarch import arch_flags  # the build-flag readers load when a file needs them

    return arch_flags(src)
