"""GPU006 (CUDA builds that leave newer GPUs without a kernel) in Python, CMake, shell scripts,
Makefiles and Dockerfiles, and the model of nvcc's flags it rests on, checked against nvcc itself."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpudoctor.lint import archflags
from lint_helpers import lines, lint_source, lint_tree, marked_lines

SETUP_PY = """
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension, load

os.environ["TORCH_CUDA_ARCH_LIST"] = "8.6"  # <-

ext = load(name="custom_module", sources=["module.cpp", "kernel.cu"],
           extra_cuda_cflags=["-arch=sm_86"])  # a lone -arch embeds compute_86 PTX: newer GPUs JIT it

nvcc_flags = ["-O3", "-gencode", "arch=compute_86,code=sm_86"]  # <-
setup(ext_modules=[CUDAExtension("a", ["a.cu"], extra_compile_args={"nvcc": nvcc_flags}),
                   CUDAExtension("b", ["b.cu"], extra_compile_args={"nvcc": ["-O3"]})])  # b takes the list

several = ["-gencode", "arch=compute_80,code=sm_80"]
several.append("-gencode")
several.append("arch=compute_90,code=sm_90")  # <- (the newest target: the entry the fix changes)

every_family = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                "-gencode", "arch=compute_100,code=sm_100", "-gencode", "arch=compute_120,code=sm_120"]
with_ptx = ["-gencode", "arch=compute_86,code=[sm_86,compute_86]"]
specific = ["-gencode", "arch=compute_90a,code=sm_90a"]  # <-
shorthand_specific = ["-arch=sm_90a"]  # nvcc 13.0 adds generic compute_90 PTX
blackwell_family = ["-gencode", "arch=compute_120f,code=sm_120f"]
native = ["-arch=native"]
computed = ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
extended = ["-gencode", "arch=compute_80,code=sm_80"] + extra_flags
docs = "use -gencode arch=compute_86,code=sm_86 to build"   # prose, not flags
"""


def test_python_flags(tmp_path):
    result = lint_source(tmp_path, SETUP_PY, name="setup.py", select=["GPU006"])
    assert lines(result, "GPU006") == marked_lines(SETUP_PY)
    env, gencode, several, specific = sorted(result.findings, key=lambda f: f.line)
    assert env.fix.applicability == "safe" and "no PTX" in env.message
    assert "sm_90 (H100)" in env.message and "sm_120/sm_121 (RTX 50xx, DGX Spark)" in env.message
    assert gencode.fix.applicability == "safe"
    # Two architectures, no PTX: the B200 and the RTX 5090 have nothing; the fix adds PTX to the newest.
    assert several.fix.applicability == "safe"
    assert "so sm_100/sm_103 (B200, B300), sm_120/sm_121 (RTX 50xx, DGX Spark) fail" in several.message
    assert [e.text for e in several.fix.edits] == ["[sm_90,compute_90]"]
    # sm_90a code runs on the H100 alone; no automatic fix can choose for its kernels.
    assert specific.fix.applicability == "display-only" and "9.0 only" in specific.message


def test_python_arch_list_alternatives_are_left_alone(tmp_path):
    source = """
    import os
    if gpu == "a100":
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0"
    else:
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    """
    assert lint_source(tmp_path, source, select=["GPU006"]).findings == []


def test_python_arch_lists_chosen_by_the_toolkit_version_are_each_judged(tmp_path):
    """A cross-compile default picked by the CUDA toolkit's version is what every build with that
    toolkit gets, whatever GPU it runs on later: each value is judged. Picked by the GPU, or by
    the toolkit and the GPU together, they stay alternatives."""
    source = """
    import os
    import torch

    cuda_major = int(torch.version.cuda.split(".")[0])
    if "TORCH_CUDA_ARCH_LIST" not in os.environ:
        if cuda_major >= 12:
            os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"  # <-
        elif cuda_major == 11:
            os.environ["TORCH_CUDA_ARCH_LIST"] = "7.0;8.0;8.6+PTX"
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = "6.1;7.0"  # <-
    """
    result = lint_source(tmp_path, source, name="setup.py", select=["GPU006"])
    assert lines(result, "GPU006") == marked_lines(source)
    by_gpu = """
    import os
    import torch

    if torch.version.cuda.startswith("12") and torch.cuda.get_device_capability()[0] >= 9:
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    else:
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0"
    """
    assert lint_source(tmp_path, by_gpu, name="setup.py", select=["GPU006"]).findings == []


def test_an_arch_list_every_extension_overrides_is_not_judged(tmp_path):
    """torch's cpp_extension adds no architecture flags of its own to an extension whose nvcc
    flags contain `arch` (`_get_cuda_arch_flags`), so TORCH_CUDA_ARCH_LIST set in a setup.py whose
    every extension passes `-gencode` flags decides nothing (llm-awq's attention setup.py: a
    toolkit-picked default list beside its own `cc_flag`); the flags themselves are judged,
    through `list()` and a concatenation passed to a helper."""
    source = """
    import os
    from torch.utils.cpp_extension import CUDAExtension

    if os.environ.get("TORCH_CUDA_ARCH_LIST") is None and bare_metal_version >= Version("11.8"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = "6.0;7.0;8.0;9.0"
    generator_flag = []
    cc_flag = list()
    cc_flag.append("-gencode")
    cc_flag.append("arch=compute_80,code=sm_80")  # <-
    ext = CUDAExtension("k", ["k.cu"], extra_compile_args={"cxx": ["-O3"],
                        "nvcc": append_nvcc_threads(["-O3"] + generator_flag + cc_flag)})
    """
    result = lint_source(tmp_path, source, name="setup.py", select=["GPU006"])
    assert lines(result, "GPU006") == marked_lines(source)
    plain = source.rstrip(' ') + '    other = CUDAExtension("o", ["o.cu"], extra_compile_args={"nvcc": ["-O3"]})\n'
    result = lint_source(tmp_path, plain, name="setup.py", select=["GPU006"])
    assert lines(result, "GPU006") == [5] + marked_lines(source)  # the list decides for `o`


def test_python_flag_lists_through_names(tmp_path):
    """A flag list concatenated with other lists of the module: their words count, as they stand
    where the concatenation is made (appends included); a name built otherwise stays unknown."""
    source = """
    from torch.utils.cpp_extension import CUDAExtension

    macros = ["-DWITH_CUDA", "-DNDEBUG"]
    arch_flags = []
    if with_ampere:
        arch_flags.append("-gencode")
        arch_flags.append("arch=compute_80,code=sm_80")  # <-
    nvcc = ["-O3", "-gencode", "arch=compute_75,code=sm_75"] + macros + arch_flags
    ext = CUDAExtension("k", ["k.cu"], extra_compile_args={"nvcc": nvcc})

    ptx_flags = ["-gencode", "arch=compute_80,code=compute_80"]
    with_ptx = ["-O3", "-gencode", "arch=compute_75,code=sm_75"] + macros + ptx_flags

    computed = [f"-gencode=arch=compute_{cc},code=sm_{cc}" for cc in ccs]
    unknown = ["-gencode", "arch=compute_75,code=sm_75"] + computed
    """
    result = lint_source(tmp_path, source, name="setup.py", select=["GPU006"])
    assert lines(result, "GPU006") == marked_lines(source)


BUILD_FILES = {
    "CMakeLists.txt": """
        cmake_minimum_required(VERSION 3.18)
        project(ext LANGUAGES CXX CUDA)
        # set(CMAKE_CUDA_ARCHITECTURES 80-real)
        set(CMAKE_CUDA_ARCHITECTURES "86-real")  # <-
        """,
    "cmake/flags.cmake": """
        list(APPEND CUDA_NVCC_FLAGS -gencode arch=compute_80,code=sm_80)
        if(CUDA_VERSION VERSION_GREATER_EQUAL 11.8)
          list(APPEND CUDA_NVCC_FLAGS -gencode arch=compute_90,code=sm_90)
        endif()
        set(CMAKE_CUDA_ARCHITECTURES 86)
        """,
    "build.sh": """
        #!/bin/bash
        # export TORCH_CUDA_ARCH_LIST="8.6"
        export TORCH_CUDA_ARCH_LIST="8.6"  # <-
        pip install --no-build-isolation .
        nvcc -O3 -c kernel.cu -o kernel.o \\
             -gencode arch=compute_86,code=sm_86  # <-
        nvcc -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=compute_90 -c k2.cu
        echo "nvcc -arch=sm_70 is only text here"
        """,
    "Makefile": """
        NVCCFLAGS := -O3 -arch=compute_75 -code=sm_75  # <-
        all:
        \tnvcc $(NVCCFLAGS) -c kernel.cu
        """,
    "Dockerfile": """
        FROM nvidia/cuda:12.8.0-devel-ubuntu22.04
        ENV TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0;12.0+PTX"
        RUN pip install flash-attn --no-build-isolation
        """,
}


def test_build_files(tmp_path):
    result = lint_tree(tmp_path, BUILD_FILES, select=["GPU006"])
    got = sorted((f.path[len(str(tmp_path)) + 1:], f.line) for f in result.findings)
    # (the nvcc command spans two lines: it is reported where its architecture flags are)
    want = sorted((name, n) for name, text in BUILD_FILES.items() for n in marked_lines(text))
    assert got == want


def _nvcc_images(flags: str) -> tuple[set[int], set[int]]:
    """(SASS, PTX) architectures of the generic images nvcc --dryrun says it embeds."""
    names = _nvcc_image_names(flags)
    return ({int(n[3:]) for n in names if n.startswith("sm_") and n[-1].isdigit()},
            {int(n[8:]) for n in names if n.startswith("compute_") and n[-1].isdigit()})


def _nvcc_image_names(flags: str) -> set[str]:
    """Every image nvcc --dryrun says it embeds: {"sm_86", "compute_86", "sm_90a", ...}."""
    proc = subprocess.run(["nvcc", *flags.split(), "--dryrun", "-c", "k.cu", "-o", "k.o"],
                          capture_output=True, text=True, timeout=60)
    text = proc.stdout + proc.stderr
    assert "fatal" not in text, text
    images = re.findall(r"--image3=kind=(elf|ptx),sm=(\d+[af]?)\b", text)
    return {("sm_" if kind == "elf" else "compute_") + arch for kind, arch in images}


@pytest.mark.nvcc
@pytest.mark.parametrize("flags", [
    "-arch=sm_86",
    "-arch sm_86",
    "--gpu-architecture=sm_86",
    "-arch=compute_86",
    "-arch=compute_86 -code=sm_86",
    "-arch=compute_86 -code=sm_86,compute_86",
    "-gencode arch=compute_86,code=sm_86",
    "-gencode=arch=compute_86,code=[sm_86,compute_86]",
    "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=compute_90",
    "-gencode arch=compute_90a,code=sm_90a",
    "-gencode arch=compute_90a,code=[sm_90a,compute_90a]",
    "-gencode arch=compute_100f,code=sm_100f",
    "-arch=sm_90a",
    "-arch=sm_120f",
    "-arch=sm_75 -gencode arch=compute_90,code=sm_90",
])
def test_the_flag_model_agrees_with_nvcc(flags):
    """What archflags believes nvcc embeds is what nvcc --dryrun says it embeds."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    t = archflags.nvcc_targets([archflags.Tok(w) for w in flags.split()])
    assert {x.name for x in t.code_targets()} == _nvcc_image_names(flags)


@pytest.mark.nvcc
def test_the_safe_fix_adds_ptx_and_keeps_the_sass(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    flags = "-O3 -gencode arch=compute_86,code=sm_86"
    toks = [archflags.Tok(m.group(), m.start()) for m in re.finditer(r"\S+", flags)]
    verdict = archflags.judge(archflags.nvcc_targets(toks), "flags")
    assert verdict is not None and verdict.edits
    fixed = flags
    for e in sorted(verdict.edits, reverse=True):
        fixed = fixed[:e.start] + e.text + fixed[e.end:]
    before, after = _nvcc_images(flags), _nvcc_images(fixed)
    assert before == ({86}, set()) and after == ({86}, {86})
    assert archflags.judge(archflags.nvcc_targets([archflags.Tok(w) for w in fixed.split()]), "flags") is None


@pytest.mark.parametrize("value, verdict", [
    ("8.6", True), ("8.6+PTX", False), ("Ampere", False), ("$ARCHS", False),
    # several architectures without PTX fail on every GPU newer than the newest of them
    ("8.0;8.6", True), ("8.6 9.0", True), ("7.0;8.0;8.6", True), ("8.0;8.6;9.0;10.0", True),
    ("7.0;8.0;8.6+PTX", False), ("8.0;8.6;9.0;10.0;12.0", False), ("8.0;8.6;9.0;10.0;12.0+PTX", False),
    # leaving out older GPUs, or a gap between targets, is a choice
    ("12.0", False), ("8.0;12.0", False), ("9.0;10.0;12.0", False),
    # arch-specific targets run on one GPU (sm_120a not on the 12.1 DGX Spark); family targets
    # within their major version
    ("9.0a", True), ("9.0a;10.0a", True), ("9.0;9.0a", True), ("12.0a", True), ("12.0f", False),
    ("10.0f", True), ("9.0a;10.0;12.0", False),
])
def test_torch_arch_list_values(value, verdict):
    t = archflags.torch_arch_targets([archflags.Tok(value, 0)])
    assert (archflags.judge(t, "TORCH_CUDA_ARCH_LIST") is not None) is verdict


def test_the_message_names_the_gpus_left_without_a_kernel():
    def message(value):
        return archflags.judge(archflags.torch_arch_targets([archflags.Tok(value, 0)]), "TORCH_CUDA_ARCH_LIST").message

    assert "so sm_120/sm_121 (RTX 50xx, DGX Spark) fail" in message("8.0;8.6;9.0;10.0")
    assert "so sm_90 (H100), sm_100/sm_103 (B200, B300), sm_120/sm_121 (RTX 50xx, DGX Spark) fail" \
        in message("7.0;8.0;8.6")
    assert "so sm_103 (B300), sm_120/sm_121" in message("9.0a;10.0a")  # sm_100a does not run on 10.3
    assert "(10.0+PTX)" in message("8.0;8.6;9.0;10.0")


def test_the_safe_fix_adds_ptx_to_the_newest_entry_only():
    value = "7.0;8.0;8.6"
    verdict = archflags.judge(archflags.torch_arch_targets([archflags.Tok(value, 0)]), "TORCH_CUDA_ARCH_LIST")
    (edit,) = verdict.edits
    fixed = value[:edit.start] + edit.text + value[edit.end:]
    assert fixed == "7.0;8.0;8.6+PTX"
    assert archflags.judge(archflags.torch_arch_targets([archflags.Tok(fixed, 0)]), "TORCH_CUDA_ARCH_LIST") is None


@pytest.mark.parametrize("value, verdict", [
    ("86-real", True), ("86", False), ("86-virtual", False), ("80-real;86-real", True), ("80-real;86", False),
    ("native", False), ("all-major", False), ("90a-real", True), ("80-real;90-real;100-real;120-real", False),
])
def test_cmake_architecture_values(value, verdict):
    t = archflags.cmake_arch_targets([archflags.Tok(value, 0)])
    assert (archflags.judge(t, "CUDA_ARCHITECTURES") is not None) is verdict


def test_fix_build_files_end_to_end(tmp_path):
    """--fix on a shell script and a CMakeLists: only PTX is added, shell-safe (no `[...]` glob)."""
    from typer.testing import CliRunner

    from gpudoctor.cli import app

    script = tmp_path / "build.sh"
    script.write_text('#!/bin/bash\nexport TORCH_CUDA_ARCH_LIST="8.6"\nnvcc -O3 -gencode arch=compute_86,code=sm_86 -c k.cu\n')
    cmake = tmp_path / "CMakeLists.txt"
    cmake.write_text('set_target_properties(ext PROPERTIES CUDA_ARCHITECTURES "86-real")\n')
    r = CliRunner().invoke(app, ["lint", str(tmp_path), "--fix"])
    assert r.exit_code == 0, r.output
    fixed = script.read_text()
    assert 'TORCH_CUDA_ARCH_LIST="8.6+PTX"' in fixed
    assert "-gencode arch=compute_86,code=sm_86 -gencode arch=compute_86,code=compute_86 -c k.cu" in fixed
    assert "[" not in fixed
    assert 'CUDA_ARCHITECTURES "86")' in cmake.read_text()
    if shutil.which("nvcc"):
        flags = fixed.splitlines()[2].split("nvcc ", 1)[1].replace(" -c k.cu", "")
        assert _nvcc_images(flags) == ({86}, {86})


def test_builds_are_judged_one_build_at_a_time(tmp_path):
    """Each build is judged on the flags it really gets, at its newest target: a target's own
    CUDA_ARCHITECTURES, a Makefile recipe with the variables it expands, a Dockerfile's ENV
    apart from an export inside one RUN step, a flag list filled by appends."""
    files = {
        "CMakeLists.txt": """
            set(CMAKE_CUDA_ARCHITECTURES 70 80 86)
            add_library(bench SHARED bench.cu)
            set_target_properties(bench PROPERTIES CUDA_ARCHITECTURES "80-real;86-real")  # <-
            """,
        "Makefile": """
            NVCCFLAGS := -O3
            NVCCFLAGS += -gencode arch=compute_80,code=sm_80
            NVCCFLAGS += -gencode arch=compute_86,code=sm_86  # <-
            main: main.cu
            \tnvcc $(NVCCFLAGS) -o $@ $^
            profile: main.cu
            \tnvcc -O3 -arch=sm_86 -o $@ $^
            """,
        "Dockerfile": """
            FROM pytorch/pytorch:2.4.1-cuda12.1-cudnn9-devel
            ENV TORCH_CUDA_ARCH_LIST="7.5;8.0;8.6"  # <-
            RUN pip install -e .
            RUN export TORCH_CUDA_ARCH_LIST="8.0;8.6+PTX" && pip install -e /opt/other
            """,
        "setup.py": """
            cc_flag = []
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_80,code=sm_80")
            if newer_cuda:
                cc_flag.append("-gencode")
                cc_flag.append("arch=compute_90,code=sm_90")  # <-
            ext = CUDAExtension("a", ["a.cu"], extra_compile_args={"nvcc": ["-O3"] + cc_flag})
            """,
    }
    files = {k: v.replace("  # <-", "") if k != "setup.py" else v for k, v in files.items()}
    result = lint_tree(tmp_path, files, select=["GPU006"])
    got = sorted((f.path.rsplit("/", 1)[-1], f.line) for f in result.findings)
    assert got == [("CMakeLists.txt", 3), ("Dockerfile", 2), ("Makefile", 3), ("setup.py", 6)]


def test_cmake_definitions_on_a_command_line_are_read(tmp_path):
    """`-DCMAKE_CUDA_ARCHITECTURES=...` / `-DTORCH_CUDA_ARCH_LIST=...` words: a help message
    that shows the option with a placeholder (this once ended the whole run in a TypeError) is
    not a build, and a real value on a cmake command line is judged."""
    files = {
        "CMakeLists.txt": """
            cmake_minimum_required(VERSION 3.18)
            if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
              message(FATAL_ERROR "pass -DCMAKE_CUDA_ARCHITECTURES=<arch> (e.g. 90)")
            endif()
            add_definitions(-DTORCH_CUDA_ARCH_LIST=<list>)
            """,
        "build.sh": """
            cmake -B build -DCMAKE_CUDA_ARCHITECTURES=80-real  # <-
            cmake -B build2 -DCMAKE_CUDA_ARCHITECTURES=80
            """,
        "other.py": "import torch\nx = torch.zeros(1).view(-1)\n",
    }
    result = lint_tree(tmp_path, files)
    assert result.errors == [] and not getattr(result, "internal_errors", [])
    got = sorted((f.path.rsplit("/", 1)[-1], f.line) for f in result.findings if f.code == "GPU006")
    assert got == [("build.sh", n) for n in marked_lines(files["build.sh"])]
    assert "SASS for sm_80 and no PTX" in next(f.message for f in result.findings if f.code == "GPU006")


def test_arch_lists_chosen_by_the_cuda_version_are_judged_per_branch(tmp_path):
    """A list taken only with a toolkit older than 12.8 cannot build for Blackwell whatever it
    lists: it is judged against the GPUs that toolkit builds for (H100 included). The branch for
    the newer toolkit, and a list no version test bounds, are judged against every GPU."""
    files = {
        "setup.py": """
            from packaging.version import Version
            bare_metal_version = Version("12.4")
            if bare_metal_version >= Version("12.8"):
                arch = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120,code=sm_120"]
            else:
                arch = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
            if int(bare_metal_major) == 11:
                old = ["-gencode", "arch=compute_80,code=sm_80"]  # <- CUDA 11.8 builds for the H100
            if has_hopper:
                other = ["-gencode", "arch=compute_90,code=sm_90"]  # <- not a toolkit test
            """,
        "CMakeLists.txt": """
            if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
              set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 100-real 120)
            elseif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 11.8)
              set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real)
            else()
              set(CMAKE_CUDA_ARCHITECTURES 70-real 75-real)  # <-
            endif()
            """,
    }
    result = lint_tree(tmp_path, {k: v.replace("  # <-", "") if k == "CMakeLists.txt" else v for k, v in files.items()},
                       select=["GPU006"])
    got = sorted((f.path.rsplit("/", 1)[-1], f.line) for f in result.findings)
    want = sorted((name, n) for name, text in files.items() for n in marked_lines(text))
    assert got == want
    cmake = next(f for f in result.findings if f.path.endswith("CMakeLists.txt"))
    # the CUDA < 11.8 branch leaves the GPUs up to what that toolkit builds for, not Blackwell
    assert "H100" not in cmake.message and "B200" not in cmake.message and "A100" in cmake.message


@pytest.mark.parametrize("tests, below", [
    ([('bare_metal_version >= Version("12.8")', False)], (12, 8)),
    ([("int(bare_metal_major) == 11", True)], (12, 0)),
    ([("int(bare_metal_major) >= 11", True)], None),
    ([("int(bare_metal_minor) > 0", True)], None),
    ([("cuda_version < (12, 8)", True)], (12, 8)),
    ([("CUDA_VERSION >= 12080", False)], (12, 8)),
    ([("float(torch.version.cuda) >= 12.8", False)], (12, 8)),
    ([("CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.8", True)], (12, 8)),
    ([("NOT CUDAToolkit_VERSION VERSION_LESS 12.8", False)], (12, 8)),
    ([('torch.version.cuda >= "12.8" and has_sm100', False)], None),
    ([("torch.cuda.get_device_capability()[0] >= 9", False)], None),
    ([("int(bare_metal_major) == 12", True), ('bare_metal_version < Version("12.8")', True)], (12, 8)),
])
def test_the_toolkit_bound_of_a_branch(tests, below):
    assert archflags.toolkit_below(tests) == below


MAKE_EXT = """
import os
from torch.utils.cpp_extension import CUDAExtension


def make_cuda_ext(name, sources, extra_args=[]):
    extra_compile_args = {"cxx": [] + extra_args}
    extra_compile_args["nvcc"] = extra_args + [
        "-D__CUDA_NO_HALF_OPERATORS__",
        "-gencode=arch=compute_75,code=sm_75",
        "-gencode=arch=compute_86,code=sm_86",  # <-
    ]
    return CUDAExtension(name=name, sources=sources, extra_compile_args=extra_compile_args)


ext_modules = [make_cuda_ext("a", ["a.cu"]), make_cuda_ext("b", ["b.cu"], extra_args=["-w", "-std=c++17"])]
"""


def test_a_list_concatenated_with_a_parameter_its_callers_fill_with_other_flags(tmp_path):
    """`extra_args + [single-token -gencode strings]` in a helper whose every call leaves
    extra_args at its default or passes flags with no architecture: the list is judged."""
    result = lint_source(tmp_path, MAKE_EXT, name="setup.py", select=["GPU006"])
    assert lines(result, "GPU006") == marked_lines(MAKE_EXT)
    # a caller that passes architecture flags of its own makes the list unknowable: quiet
    adds_ptx = MAKE_EXT.replace('extra_args=["-w", "-std=c++17"]', 'extra_args=["-gencode=arch=compute_90,code=compute_90"]')
    assert lines(lint_source(tmp_path, adds_ptx, name="setup.py", select=["GPU006"]), "GPU006") == []


COG = """
build:
  gpu: true
  cuda: "11.8"
  python_packages:
    - "torch==2.1.0"
  run:
    - pip install ninja
    - command: echo "TORCH_CUDA_ARCH_LIST is read from the build line below"
    - TORCH_CUDA_ARCH_LIST='8.0' FORCE_CUDA=1 pip install ./ops  # <-
    - |
      cd kernels && nvcc -gencode arch=compute_86,code=sm_86 -c k.cu  # <-
predict: "predict.py:Predictor"
run:
  - TORCH_CUDA_ARCH_LIST='7.0' echo "not under build: not a build command"
"""


def test_cog_build_commands_are_read_as_shell(tmp_path):
    """A Cog build file's build.run commands (plain, `command:` mappings, block scalars) are read
    like a shell script; the rest of the YAML is not."""
    result = lint_tree(tmp_path, {"cog.yaml": COG}, select=["GPU006"])
    assert lines(result, "GPU006") == marked_lines(COG)
    assert result.files_checked == 1
