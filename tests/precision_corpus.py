"""The redaction precision corpus: real strings that a redacted report must carry unchanged.

Redaction that also "finds" secrets in ordinary paths eats the line that matters (`python
/tmp/tmp.6xjVbbjJMQ/main/tests/fixtures/run/dtype_mismatch.py` once became `python
/tmp/tmp.<secret-1>_mismatch.py`). This corpus is what such a rule must leave alone:

- every file of real installed distributions (tests/fixtures/redaction/paths.txt.gz, made by
  tools/redaction_paths.py from the RECORD files of torch, transformers, diffusers, numpy,
  huggingface_hub, accelerate, the nvidia-* CUDA wheels and the rest of a test environment) and of
  this repository, each under a folder where real environments live: plain prefixes (conda,
  system, venv, pyenv, Windows), `mktemp -d` folders, Python `tempfile` folders, pytest's
  `tmp_path`, Ray sessions, uv, Poetry and pipenv caches, container overlay and containerd
  snapshots, Nix store paths; as plain paths, traceback `File "..."` lines, `python PATH` commands,
  warnings (`PATH:LINE: UserWarning`), loader errors and RECORD rows with their base64 digests;
- Hugging Face hub and module caches (`models--org--name/snapshots/<40-hex>/...`), ModelScope,
  torch hub and extension caches, Triton and TorchInductor caches, pip's wheel cache and build
  folders, wandb run folders, Lightning, Hydra, MLflow and TensorBoard folders;
- source lines as tracebacks show them (`token = kwargs.pop("token")`, `node: torch.fx.Node`),
  written in the idioms of torch, transformers and huggingface_hub;
- commit hashes, wheel names, pip's lines, CUDA library versions, `nvcc`/`collect_env` lines,
  tensor shapes and the messages around them, `nvidia-smi` tables and `-q` fields, NCCL INFO
  lines and torch.distributed log lines.

The random parts of folder names (mktemp's 10 letters and digits, hashes, run ids) come from a
seeded `random.Random`, so the corpus is the same on every machine (this repository's own files
are listed when the corpus is built: they change with it). `corpus()` returns
(family, text, expected) triples: `expected` is `text` with the one identity that a line carries
on purpose replaced (the NCCL host prefix of this machine, `gpu-box-17`, is `<host>`); every other
character must come through.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import pathlib
import random
import string

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATHS = ROOT / "tests" / "fixtures" / "redaction" / "paths.txt.gz"
HOST = "gpu-box-17"  # the host of the redactor the corpus is checked with (tests/test_redact.py)
_REPO_DIRS = ("doctor", "probes", "reports", "tests", "tools", "benchmarks", ".ci")

_ALNUM = string.ascii_letters + string.digits
_LOWER_ALNUM = string.ascii_lowercase + string.digits
_B32_LOWER = "abcdefghijklmnopqrstuvwxyz234567"
_NIX = "0123456789abcdfghijklmnpqrsvwxyz"  # Nix's base32 alphabet (no e, o, t, u)


def distribution_paths() -> list[str]:
    """The installed files of the distributions in paths.txt.gz, relative to site-packages."""
    with gzip.open(PATHS, "rt", encoding="utf-8") as f:
        return [line for line in f.read().splitlines() if line and not line.startswith("# ")]


def repository_paths() -> list[str]:
    """This checkout's own source, test and fixture files, relative to its root."""
    out = []
    for top in _REPO_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and "__pycache__" not in rel.parts and not any(p.startswith(".venv") for p in rel.parts):
                out.append(rel.as_posix())
    return out


class _Random(random.Random):
    def word(self, alphabet: str, n: int) -> str:
        return "".join(self.choice(alphabet) for _ in range(n))

    def hex(self, n: int) -> str:
        return self.word("0123456789abcdef", n)

    def mktemp(self) -> str:
        return "/tmp/tmp." + self.word(_ALNUM, 10)  # mktemp -d: tmp.XXXXXXXXXX

    def pytemp(self) -> str:
        return "/tmp/tmp" + self.word(_LOWER_ALNUM + "_", 8)  # tempfile.mkdtemp()

    def stamp(self) -> tuple[str, str, str]:
        """(date, time, microseconds) of a run in 2026."""
        return (f"2026-{self.randint(1, 12):02d}-{self.randint(1, 28):02d}",
                f"{self.randint(0, 23):02d}-{self.randint(0, 59):02d}-{self.randint(0, 59):02d}",
                f"{self.randint(0, 999999):06d}")


_PY = ("3.10", "3.11", "3.12", "3.13")
_TESTS = ("test_cli_bundle_from_a_real_t", "test_localize_reports_the_re", "test_x", "test_scan_cpu", "test_roundtrip")
_CI_USERS = ("root", "runner", "jenkins", "gitlab-runner", "ubuntu", "builder")
_PROJECTS = ("train", "diffsynth", "multitalk", "llm-finetune", "sdxl-lora", "vision")


def _site_packages(rng: _Random) -> str:
    """A site-packages folder, as real environments place them."""
    py = rng.choice(_PY)
    choice = rng.randrange(24)
    d, t, us = rng.stamp()
    return [
        f"/opt/conda/lib/python{py}/site-packages",
        f"/usr/local/lib/python{py}/dist-packages",
        "/usr/lib/python3/dist-packages",
        f"/opt/venv/lib/python{py}/site-packages",
        f"{rng.mktemp()}/venv/lib/python{py}/site-packages",
        f"{rng.mktemp()}/main/.venv/lib/python{py}/site-packages",
        f"{rng.pytemp()}/env/lib/python{py}/site-packages",
        f"/tmp/pytest-of-{rng.choice(_CI_USERS)}/pytest-{rng.randint(0, 400)}/{rng.choice(_TESTS)}0/venv/lib/python{py}/site-packages",
        f"/tmp/ray/session_{d}_{t}_{us}_{rng.randint(100, 99999)}/runtime_resources/pip/{rng.hex(40)}/virtualenv/lib/python{py}/site-packages",
        f"/tmp/ray/session_{d}_{t}_{us}_{rng.randint(100, 99999)}/runtime_resources/conda/{rng.hex(40)}/lib/python{py}/site-packages",
        f"/var/lib/docker/overlay2/{rng.hex(64)}/merged/usr/local/lib/python{py}/site-packages",
        f"/var/lib/docker/overlay2/{rng.hex(64)}/diff/opt/conda/lib/python{py}/site-packages",
        f"/var/lib/containers/storage/overlay/{rng.hex(64)}/merged/usr/lib/python{py}/site-packages",
        f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{rng.hex(64)}/rootfs/usr/local/lib/python{py}/dist-packages",
        f"/root/.cache/uv/archive-v0/{rng.word(_ALNUM + '_-', 21)}",
        f"/root/.cache/pypoetry/virtualenvs/{rng.choice(_PROJECTS)}-{rng.word(_ALNUM + '_-', 8)}-py{py}/lib/python{py}/site-packages",
        f"/root/.local/share/virtualenvs/{rng.choice(_PROJECTS)}-{rng.word(_ALNUM, 8)}/lib/python{py}/site-packages",
        f"/opt/hostedtoolcache/Python/{py}.{rng.randint(0, 12)}/x64/lib/python{py}/site-packages",
        f"/root/.pyenv/versions/{py}.{rng.randint(0, 12)}/lib/python{py}/site-packages",
        f"/nix/store/{rng.word(_NIX, 32)}-python{py}-torch-2.5.1/lib/python{py}/site-packages",
        f"/tmp/pip-build-env-{rng.word(_LOWER_ALNUM + '_', 8)}/overlay/lib/python{py}/site-packages",
        f"/root/.cache/uv/builds-v0/.tmp{rng.word(_ALNUM, 6)}/lib/python{py}/site-packages",
        f"/workspace/.venv/lib/python{py}/site-packages",
        f"/root/miniconda3/envs/py{py.replace('.', '')}/lib/python{py}/site-packages",
    ][choice]


def _windows_site_packages(rng: _Random) -> str:
    py = rng.choice(_PY)
    return rng.choice([
        f"C:\\Python{py.replace('.', '')}\\Lib\\site-packages",
        f"C:\\hostedtoolcache\\windows\\Python\\{py}.{rng.randint(0, 12)}\\x64\\Lib\\site-packages",
        f"D:\\a\\_temp\\venv\\Lib\\site-packages",
        f"C:\\ProgramData\\miniconda3\\envs\\py{py.replace('.', '')}\\Lib\\site-packages",
    ])


def _checkout(rng: _Random) -> str:
    """Where a checkout of a project lives: a clone for CI or a test, a container, a job folder."""
    d, t, us = rng.stamp()
    return rng.choice([
        "/tmp/tmp.6xjVbbjJMQ/main",
        f"{rng.mktemp()}/main",
        f"{rng.mktemp()}/gpudoctor",
        f"{rng.pytemp()}/repo",
        f"/tmp/pytest-of-{rng.choice(_CI_USERS)}/pytest-{rng.randint(0, 400)}/{rng.choice(_TESTS)}0/clone",
        f"/tmp/ray/session_{d}_{t}_{us}_{rng.randint(100, 99999)}/runtime_resources/working_dir_files/_ray_pkg_{rng.hex(16)}",
        f"/var/lib/docker/overlay2/{rng.hex(64)}/merged/workspace",
        f"/__w/{rng.choice(_PROJECTS)}/{rng.choice(_PROJECTS)}",
        f"/builds/ml/{rng.choice(_PROJECTS)}",
        f"/var/jenkins_home/workspace/{rng.choice(_PROJECTS)}@2",
        f"/workspace/{rng.choice(_PROJECTS)}",
        f"/scratch/slurm-{rng.randint(100000, 9999999)}/{rng.choice(_PROJECTS)}",
        f"/kaggle/working/{rng.choice(_PROJECTS)}",
        f"/content/drive/MyDrive/{rng.choice(_PROJECTS)}",
        f"/tmp/systemd-private-{rng.hex(32)}-jupyter.service-{rng.word(_ALNUM, 6)}/tmp/{rng.choice(_PROJECTS)}",
        f"/tmp/torchelastic_{rng.word(_LOWER_ALNUM + '_', 8)}/none_{rng.word(_LOWER_ALNUM + '_', 8)}/attempt_0/0",
    ])


_FUNCS = ("forward", "_call_impl", "_wrapped_call_impl", "__init__", "from_pretrained", "load_state_dict",
          "__call__", "decorate_context", "<module>", "main", "_conv_forward", "scaled_dot_product_attention",
          "step", "backward", "run", "_fn", "inner", "wrapper", "_load_from_state_dict", "to")
_WARNINGS = ("UserWarning: TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only storage class.",
             "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` instead.",
             "UserWarning: To copy construct from a tensor, it is recommended to use sourceTensor.clone().detach()",
             "FutureWarning: You are using `torch.load` with `weights_only=False`",
             "DeprecationWarning: pkg_resources is deprecated as an API")


def _path_lines(rng: _Random, path: str, full: str) -> str:
    """`full` (a path) in a form a log or a traceback shows it."""
    if path.endswith(".py"):
        return rng.choice([
            full,
            f'  File "{full}", line {rng.randint(1, 4000)}, in {rng.choice(_FUNCS)}',
            f'File "{full}", line {rng.randint(1, 4000)}, in {rng.choice(_FUNCS)}',
            f"python {full}",
            f"python3 -u {full} --config configs/base.yaml",
            f"torchrun --nproc-per-node 8 {full}",
            f"{full}:{rng.randint(1, 4000)}: {rng.choice(_WARNINGS)}",
            f"python -m pytest -q {full}::test_roundtrip",
        ])
    if ".so" in path:
        return rng.choice([
            full,
            f"OSError: {full}: cannot open shared object file: No such file or directory",
            f"ImportError: {full}: undefined symbol: _ZN3c104cuda9SetDeviceEa",
            f"        libcudart.so.12 => {full} (0x00007f3a2c000000)",
        ])
    return rng.choice([full, f"  {full}", f"'{full}'", f"Loading {full}", f"FileNotFoundError: [Errno 2] No such file or directory: '{full}'"])


def _record_row(path: str) -> str:
    """A RECORD row with the form of its digest (urlsafe base64 sha256 without padding)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.encode()).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(path) * 97}"


def _installed(rng: _Random, paths: list[str]) -> list[tuple[str, str]]:
    out = []
    for i, path in enumerate(paths):
        sp = _site_packages(rng)
        out.append(("site-packages", _path_lines(rng, path, f"{sp}/{path}")))
        if path.endswith(".py"):  # a second place: a traceback from another environment
            line = rng.randint(1, 4000)
            out.append(("traceback", f'  File "{_site_packages(rng)}/{path}", line {line}, in {rng.choice(_FUNCS)}'))
        if i % 7 == 0:
            out.append(("windows", _path_lines(rng, path, _windows_site_packages(rng) + "\\" + path.replace("/", "\\"))))
        if i % 5 == 0:
            out.append(("RECORD", _record_row(path)))
    return out


def _checkouts(rng: _Random, paths: list[str]) -> list[tuple[str, str]]:
    out = []
    for path in paths:
        for _ in range(3):
            out.append(("checkout", _path_lines(rng, path, f"{_checkout(rng)}/{path}")))
    return out


# --- caches ------------------------------------------------------------------------------------------

_HF_REPOS = (
    "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3",
    "stabilityai/stable-diffusion-xl-base-1.0", "black-forest-labs/FLUX.1-dev", "openai/whisper-large-v3",
    "google/gemma-2-9b-it", "microsoft/Phi-3-mini-4k-instruct", "deepseek-ai/DeepSeek-V3", "bert-base-uncased",
    "sentence-transformers/all-MiniLM-L6-v2", "stable-diffusion-v1-5/stable-diffusion-v1-5", "Wan-AI/Wan2.1-T2V-14B",
    "MeiGen-AI/MeiGen-MultiTalk", "THUDM/CogVideoX-5b", "tencent/HunyuanVideo", "facebook/opt-125m",
    "EleutherAI/gpt-neox-20b", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "HuggingFaceTB/SmolLM2-135M",
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", "openai/clip-vit-large-patch14", "madebyollin/sdxl-vae-fp16-fix",
    "Qwen/Qwen2-VL-7B-Instruct", "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF", "TheBloke/Llama-2-7B-Chat-GPTQ",
)
_HF_DATASETS = ("HuggingFaceFW/fineweb-edu", "allenai/c4", "tatsu-lab/alpaca", "openai/gsm8k", "laion/laion2B-en-aesthetic")
_HF_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "model-00001-of-00004.safetensors",
    "model-00003-of-00004.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "pytorch_model.bin",
    "unet/diffusion_pytorch_model.fp16.safetensors", "vae/config.json", "text_encoder_2/model.safetensors",
    "scheduler/scheduler_config.json", "model_index.json", "README.md", "preprocessor_config.json",
    "chat_template.jinja", "transformer/diffusion_pytorch_model-00002-of-00003.safetensors", "original/params.json",
)
_MODULE_FILES = ("modeling_deepseek.py", "configuration_deepseek.py", "modeling_chatglm.py", "tokenization_qwen.py", "modeling_phi3.py")


def _hf_caches(rng: _Random, n: int) -> list[tuple[str, str]]:
    out = []
    roots = ("/root/.cache/huggingface", "/data/hf_cache", "/mnt/models/.cache/huggingface",
             "/tmp/tmp.{}/hf", "/workspace/.hf_home", "D:\\hf_cache")
    for _ in range(n):
        root = rng.choice(roots)
        if "{}" in root:
            root = root.format(rng.word(_ALNUM, 10))
        repo = rng.choice(_HF_REPOS)
        org_name = repo.replace("/", "--")
        rev = rng.hex(40)
        kind = rng.randrange(9)
        if kind <= 3:
            p = f"{root}/hub/models--{org_name}/snapshots/{rev}/{rng.choice(_HF_FILES)}"
        elif kind == 4:
            p = f"{root}/hub/models--{org_name}/blobs/{rng.hex(64)}"
        elif kind == 5:
            p = f"{root}/hub/datasets--{rng.choice(_HF_DATASETS).replace('/', '--')}/snapshots/{rev}/data/train-{rng.randint(0, 99):05d}-of-00100.parquet"
        elif kind == 6:
            p = f"{root}/modules/transformers_modules/{repo}/{rev}/{rng.choice(_MODULE_FILES)}"
        elif kind == 7:
            p = f"{root}/hub/models--{org_name}/.no_exist/{rev}/adapter_config.json"
        else:
            p = f"{root}/hub/models--{org_name}/refs/main"
        if root.startswith("D:"):
            p = p.replace("/", "\\")
        out.append(("huggingface", _path_lines(rng, p, p) if not p.endswith(".py") else
                    f'  File "{p}", line {rng.randint(1, 2000)}, in {rng.choice(_FUNCS)}'))
    for _ in range(n // 10):
        repo = rng.choice(_HF_REPOS)
        out += [
            ("huggingface", f"Downloading shards: 100%|██████████| 4/4 [00:{rng.randint(10, 59)}<00:00,  3.05s/it]"),
            ("huggingface", f"A new version of the following files was downloaded from https://huggingface.co/{repo}:\n- {rng.choice(_MODULE_FILES)}"),
            ("huggingface", f"hf_hub_download(repo_id='{repo}', filename='config.json', revision='{rng.hex(40)}')"),
            ("huggingface", f"OSError: {repo} does not appear to have a file named pytorch_model.bin. Checkout 'https://huggingface.co/{repo}/tree/{rng.hex(40)}' for available files."),
        ]
    return out


def _other_caches(rng: _Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        d, t, us = rng.stamp()
        proj = rng.choice(_PROJECTS)
        run = f"run-2026{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}_{t.replace('-', '')}-{rng.word(_LOWER_ALNUM, 8)}"
        inductor = "c" + rng.word(_B32_LOWER, 51)
        base32_upper = rng.word("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 52)
        wheel_key = rng.hex(56)
        choice = rng.randrange(22)
        line = [
            f"/workspace/{proj}/wandb/{run}/files/output.log",
            f"wandb: Run data is saved locally in {rng.mktemp()}/wandb/{run}",
            f"wandb: 🚀 View run at https://wandb.ai/ml-team/{proj}/runs/{run[-8:]}",
            f"wandb: Find logs at: ./wandb/{run}/logs",
            f"/tmp/ray/session_{d}_{t}_{us}_{rng.randint(100, 99999)}/logs/worker-{rng.hex(56)}-01000000-{rng.randint(100, 99999)}.err",
            f"(RayTrainWorker pid={rng.randint(100, 99999)}) /tmp/ray/session_latest/runtime_resources/working_dir_files/_ray_pkg_{rng.hex(16)}/train.py:{rng.randint(1, 400)}: {rng.choice(_WARNINGS)}",
            f"/root/.cache/torch/hub/checkpoints/{rng.choice(('resnet50', 'vgg16', 'vit_b_16', 'efficientnet_b0'))}-{rng.hex(8)}.pth",
            f"/root/.cache/torch_extensions/py{rng.choice(('310', '311', '312'))}_cu{rng.choice(('121', '124', '126', '128'))}/{rng.choice(('fused_adam', 'cpu_adam', 'transformer_inference'))}/build.ninja",
            f"/root/.triton/cache/{base32_upper}/triton_poi_fused_add_mul_{rng.randint(0, 40)}.cubin",
            f"/root/.triton/cache/{rng.hex(32)}/_attn_fwd.ptx",
            f"/tmp/torchinductor_root/{inductor[1:3]}/{inductor}.py",
            f'  File "/tmp/torchinductor_root/{inductor[1:3]}/{inductor}.py", line {rng.randint(10, 900)}, in call',
            f"/tmp/torchinductor_root/fxgraph/{inductor[1:3]}/f{inductor[1:]}/{rng.word(_B32_LOWER, 52)}",
            f"  Stored in directory: /root/.cache/pip/wheels/{wheel_key[:2]}/{wheel_key[2:4]}/{wheel_key[4:6]}/{wheel_key[6:]}",
            f"/tmp/pip-install-{rng.word(_LOWER_ALNUM + '_', 8)}/flash-attn_{rng.hex(32)}/setup.py",
            f"/root/.cache/modelscope/hub/models/Wan-AI/Wan2___1-T2V-14B/diffusion_pytorch_model-0000{rng.randint(1, 6)}-of-00006.safetensors",
            f"{proj}/lightning_logs/version_{rng.randint(0, 40)}/checkpoints/epoch={rng.randint(0, 99)}-step={rng.randint(100, 99999)}.ckpt",
            f"outputs/{d}/{t}/.hydra/config.yaml",
            f"mlruns/{rng.randint(0, 900000000)}/{rng.hex(32)}/artifacts/model/data/model.pth",
            f"runs/Nov{rng.randint(10, 28)}_{t.replace('-', '-')}_{rng.hex(12)}/events.out.tfevents.1764050540.{rng.hex(12)}.{rng.randint(100, 99999)}.0",
            f"File /tmp/ipykernel_{rng.randint(100, 99999)}/{rng.randint(10**9, 10**10 - 1)}.py:{rng.randint(1, 60)}",
            f"/root/.cache/bazel/_bazel_root/{rng.hex(32)}/execroot/_main/bazel-out/k8-opt/bin/libtorch_cuda.so",
        ][choice]
        out.append(("caches", line))
    return out


# --- versions, hashes, wheels --------------------------------------------------------------------------

# pip's names and versions of the CUDA wheels beside torch releases (pins in torch's METADATA).
_CUDA_STACKS = (
    ("2.4.1", "cu121", "12.1", {"cublas": "12.1.3.1", "cudnn": "9.1.0.70", "nccl": "2.20.5", "cuda-runtime": "12.1.105", "cufft": "11.0.2.54", "curand": "10.3.2.106", "cusolver": "11.4.5.107", "cusparse": "12.1.0.106", "nvjitlink": "12.1.105"}),
    ("2.5.1", "cu124", "12.4", {"cublas": "12.4.5.8", "cudnn": "9.1.0.70", "nccl": "2.21.5", "cuda-runtime": "12.4.127", "cufft": "11.2.1.3", "curand": "10.3.5.147", "cusolver": "11.6.1.9", "cusparse": "12.3.1.170", "nvjitlink": "12.4.127"}),
    ("2.7.0", "cu126", "12.6", {"cublas": "12.6.4.1", "cudnn": "9.5.1.17", "nccl": "2.26.2", "cuda-runtime": "12.6.77", "cufft": "11.3.0.4", "curand": "10.3.7.77", "cusolver": "11.7.1.2", "cusparse": "12.5.4.2", "nvjitlink": "12.6.85", "cusparselt": "0.6.3"}),
    ("2.8.0", "cu128", "12.8", {"cublas": "12.8.4.1", "cudnn": "9.10.2.21", "nccl": "2.27.3", "cuda-runtime": "12.8.90", "cufft": "11.3.3.83", "curand": "10.3.9.90", "cusolver": "11.7.3.90", "cusparse": "12.5.8.93", "nvjitlink": "12.8.93", "cusparselt": "0.7.1", "cufile": "1.13.1.3"}),
    ("2.9.1", "cu130", "13.0", {"cublas": "13.0.0.19", "cudnn": "9.13.0.50", "nccl": "2.27.7", "cuda-runtime": "13.0.48", "cufft": "12.0.0.15", "curand": "10.4.0.35", "cusolver": "12.0.3.29", "cusparse": "12.6.2.49", "nvjitlink": "13.0.39", "cusparselt": "0.8.0"}),
)
_LIBS = {"cublas": "libcublas.so", "cudnn": "libcudnn.so", "nccl": "libnccl.so", "cuda-runtime": "libcudart.so",
         "cufft": "libcufft.so", "curand": "libcurand.so", "cusolver": "libcusolver.so", "cusparse": "libcusparse.so",
         "nvjitlink": "libnvJitLink.so", "cusparselt": "libcusparseLt.so", "cufile": "libcufile.so"}
_TAGS = ("cp310-cp310-linux_x86_64", "cp311-cp311-linux_x86_64", "cp312-cp312-manylinux_2_28_x86_64",
         "cp311-cp311-manylinux_2_28_aarch64", "cp311-cp311-win_amd64", "cp313-cp313t-manylinux_2_28_x86_64")


def _versions(rng: _Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        torch, cu, cuda, libs = rng.choice(_CUDA_STACKS)
        name, ver = rng.choice(sorted(libs.items()))
        cu_major = cu[:4]
        pip = f"nvidia-{name}-{cu_major}" if name not in ("cuda-runtime",) else f"nvidia-cuda-runtime-{cu_major}"
        tag = rng.choice(_TAGS)
        sha = rng.hex(64)
        commit = rng.hex(40)
        out += [
            ("versions", f"{pip}=={ver}"),
            ("versions", f"[pip3] {pip}=={ver}"),
            ("versions", f"Requirement already satisfied: {pip}=={ver} in /usr/local/lib/python3.11/dist-packages (from torch=={torch}+{cu})"),
            ("versions", f"Downloading {pip.replace('-', '_')}-{ver}-py3-none-manylinux_2_27_x86_64.whl ({rng.randint(1, 900)}.{rng.randint(0, 9)} MB)"),
            ("versions", f"/usr/local/cuda-{cuda}/targets/x86_64-linux/lib/{_LIBS[name]}.{ver}"),
            ("versions", f"\t{_LIBS[name].split('.')[0]}.so.{ver.split('.')[0]} (libc6,x86-64) => /usr/local/lib/python3.11/dist-packages/nvidia/{name.split('-')[0]}/lib/{_LIBS[name]}.{ver.split('.')[0]}"),
            ("versions", f"torch {torch}+{cu}, CUDA {cuda}, cuDNN {libs['cudnn']}, NCCL {libs['nccl']}"),
            ("versions", f"torch.__version__ = {torch}+{cu}; torch.version.cuda = {cuda}; torch.version.git_version = {commit}"),
            ("wheels", f"torch-{torch}+{cu}-{tag}.whl"),
            ("wheels", f"Downloading https://download.pytorch.org/whl/{cu}/torch-{torch}%2B{cu}-{tag}.whl ({rng.randint(700, 1200)}.{rng.randint(0, 9)} MB)"),
            ("wheels", f"flash_attn-2.{rng.randint(5, 8)}.{rng.randint(0, 4)}.post1+{cu_major}torch{torch[:3]}cxx11abi{rng.choice(('TRUE', 'FALSE'))}-{tag}.whl"),
            ("wheels", f"xformers-0.0.{rng.randint(27, 33)}.post{rng.randint(1, 3)}-cp39-abi3-manylinux_2_28_x86_64.whl"),
            ("wheels", f"  Created wheel for flash-attn: filename=flash_attn-2.7.4.post1-{tag}.whl size={rng.randint(10**8, 3 * 10**8)} sha256={sha}"),
            ("wheels", f"{pip}=={ver} --hash=sha256:{sha}"),
            ("commits", f"Resolved https://github.com/huggingface/diffusers.git to commit {commit}"),
            ("commits", f"  Running command git checkout -q {commit}"),
            ("commits", f"diffusers @ git+https://github.com/huggingface/diffusers.git@{commit}"),
            ("commits", f"pip install git+https://github.com/huggingface/transformers@{commit}"),
            ("commits", f"HEAD is now at {commit[:7]} Fix dtype of the VAE decoder"),
            ("commits", f"commit {commit} (HEAD -> main, origin/main)"),
            ("commits", f"torch {torch}a0+git{commit[:7]}"),
            ("commits", f"image sha256:{sha}"),
            ("commits", f"nvcr.io/nvidia/pytorch:25.{rng.randint(1, 12):02d}-py3@sha256:{sha}"),
            ("cuda", f"Cuda compilation tools, release {cuda}, V{cuda}.{rng.randint(41, 131)}"),
            ("cuda", f"Build cuda_{cuda}.r{cuda}/compiler.{rng.randint(30000000, 36999999)}_0"),
            ("cuda", f"CUDA runtime version: {libs['cuda-runtime']}"),
            ("cuda", f"cuDNN version: {libs['cudnn'].split('.')[0]}{int(libs['cudnn'].split('.')[1]):02d}{libs['cudnn'].split('.')[2]:0>2}"),
            ("cuda", f"NCCL version {libs['nccl']}+cuda{cuda}"),
            ("cuda", f"torch.cuda.nccl.version() = ({', '.join(libs['nccl'].split('.'))})"),
        ]
    return out


# --- shapes, GPU tables, distributed logs -----------------------------------------------------------

def _shapes(rng: _Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        b, h, s, d = rng.choice((1, 2, 4, 8, 16)), rng.choice((8, 12, 16, 32, 40)), rng.choice((77, 256, 1024, 4096, 8192)), rng.choice((64, 80, 128, 256))
        m, k, k2, nn = rng.randint(1, 8192), rng.randint(1, 16384), rng.randint(1, 16384), rng.randint(1, 16384)
        out += [
            ("shapes", f"torch.Size([{b}, {h}, {s}, {d}])"),
            ("shapes", f"RuntimeError: mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{nn})"),
            ("shapes", f"RuntimeError: The size of tensor a ({s}) must match the size of tensor b ({d}) at non-singleton dimension {rng.randint(0, 3)}"),
            ("shapes", f"RuntimeError: shape '[-1, {h}, {d}]' is invalid for input of size {m * k}"),
            ("shapes", f"RuntimeError: Given groups=1, weight of size [{h * 8}, {b * 4}, 3, 3], expected input[{b}, {d}, {s}, {s}] to have {b * 4} channels, but got {d} channels instead"),
            ("shapes", f"query: shape=({b}, {h}, {s}, {d}) (torch.bfloat16) key: shape=({b}, {h}, {s}, {d}) stride=({h * s * d}, {s * d}, {d}, 1)"),
            ("shapes", f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {rng.randint(1, 900)}.{rng.randint(0, 99):02d} MiB. GPU 0 has a total capacity of 79.11 GiB of which {rng.randint(1, 900)}.{rng.randint(0, 99):02d} MiB is free. Process {rng.randint(100, 99999)} has 78.{rng.randint(10, 99)} GiB memory in use."),
            ("shapes", f"x: tensor(shape=[{b}, {s}, {h * d}], dtype=torch.float16, device='cuda:{rng.randint(0, 7)}') at 0x7f{rng.hex(10)}"),
        ]
    return out


_GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "NVIDIA L40S", "Tesla V100-SXM2-32GB",
         "NVIDIA H200", "NVIDIA B200", "NVIDIA RTX A6000", "NVIDIA A10G", "NVIDIA GeForce RTX 5090")
_DRIVERS = (("535.183.01", "12.2"), ("550.54.15", "12.4"), ("550.127.05", "12.4"), ("560.35.03", "12.6"),
            ("570.133.20", "12.8"), ("575.57.08", "12.9"), ("580.65.06", "13.0"))


def _nvidia_smi(rng: _Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        gpu, (drv, cuda) = rng.choice(_GPUS), rng.choice(_DRIVERS)
        bus = f"00000000:{rng.choice(('18', '2A', '3A', '5D', '9A', 'AB', 'BA', 'DB'))}:00.0"
        i, pid = rng.randint(0, 7), rng.randint(100, 99999)
        mem = rng.randint(1, 81000)
        out += [
            ("nvidia-smi", f"| NVIDIA-SMI {drv}             Driver Version: {drv}     CUDA Version: {cuda}     |"),
            ("nvidia-smi", f"|   {i}  {gpu:<26}On  |   {bus} Off |                    0 |"),
            ("nvidia-smi", f"| N/A   {rng.randint(25, 80)}C    P0            {rng.randint(50, 700)}W /  700W |   {mem}MiB /  81559MiB |    {rng.randint(0, 100)}%      Default |"),
            ("nvidia-smi", f"|    {i}   N/A  N/A      {pid}      C   /opt/conda/bin/python3.11                {mem}MiB |"),
            ("nvidia-smi", f"    Product Name                          : {gpu}"),
            ("nvidia-smi", f"    VBIOS Version                         : 96.00.{rng.randint(10, 99)}.00.{rng.randint(1, 9):02d}"),
            ("nvidia-smi", f"    Bus Id                                : {bus}"),
            ("nvidia-smi", f"    GPU Part Number                       : 2330-885-A1"),
            ("nvidia-smi", f"        Image Version                     : G520.0200.00.05"),
            ("nvidia-smi", f"    Module ID                             : {rng.randint(1, 8)}"),
            ("nvidia-smi", f"{gpu}, {drv}, {mem} MiB, {bus}, {rng.randint(0, 100)} %"),
            ("nvidia-smi", f"GPU{i}\t X \tNV18\tNV18\tNV18\tNV18\tSYS\t0-55,112-167\t0\t\tN/A"),
            ("nvidia-smi", f"[{i}] {gpu} | {rng.randint(25, 80)}°C, {rng.randint(0, 100)} % | {mem} / 81559 MB | python/{pid}({mem}M)"),
        ]
    return out


_NCCL_INFO = (
    "NCCL INFO cudaDriverVersion {drv}",
    "NCCL INFO NCCL version {nccl}+cuda{cuda}",
    "NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
    "NCCL INFO NET/IB : No device found.",
    "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB eth0",
    "NCCL INFO Using non-device net plugin version 0",
    "NCCL INFO Using network IB",
    "NCCL INFO comm 0x{ptr} rank {rank} nranks 8 cudaDev {rank} nvmlDev {rank} busId {bus} commId 0x{comm} - Init START",
    "NCCL INFO Setting affinity for GPU {rank} to ffffffff,00000000,ffffffff",
    "NCCL INFO Channel {ch:02d}/24 :    0   1   2   3   4   5   6   7",
    "NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
    "NCCL INFO P2P Chunksize set to 524288",
    "NCCL INFO Channel {ch:02d}/0 : {rank}[{rank}] -> {peer}[{peer}] via P2P/CUMEM/read",
    "NCCL INFO Connected all rings",
    "NCCL INFO Connected all trees",
    "NCCL INFO NVLS multicast support is available on dev {rank}",
    "NCCL INFO threadThresholds 8/8/64 | 64/8/64 | 512 | 512",
    "NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
    "NCCL INFO CC Off, Multi-GPU CC Off, workFifoBytes 1048576",
    "NCCL INFO TUNER/Plugin: Could not find: libnccl-tuner.so. Using internal tuner plugin.",
    "NCCL INFO ncclCommInitRankConfig comm 0x{ptr} rank {rank} nRanks 8 nNodes 1 localRanks 8 localRank {rank} MNNVL 0",
    "NCCL INFO Init timings - ncclCommInitRank: rank {rank} nranks 8 total 0.71 (kernels 0.18, alloc 0.05, bootstrap 0.01, allgathers 0.02, topo 0.31, graphs 0.01, connections 0.10, rest 0.03)",
    "NCCL INFO comm 0x{ptr} rank {rank} nranks 8 cudaDev {rank} busId {bus} - Destroy COMPLETE",
    "NCCL INFO [Service thread] Connection closed by localRank {rank}",
    "NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
    "NCCL INFO NCCL_IB_HCA set to mlx5_0,mlx5_1",
    "NCCL INFO MNNVL busId 0x{bus} fabric UUID 0.0 cliqueId 0x0 state 3 healthMask 0x0",
    "NCCL WARN Cuda failure 'out of memory'",
    "NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err 129 (Recv)",
)
_TORCH_DIST = (
    "[rank{rank}]:[W{md} {hms}.{ns} {pid} ProcessGroupNCCL.cpp:4561] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is thus deprecated. (function operator())",
    "[rank{rank}]:[E{md} {hms}.{ns} {pid} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600032 milliseconds before timing out.",
    "[rank{rank}]:[I{md} {hms}.{ns} {pid} torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:930] [PG ID 0 PG GUID 0 Rank {rank}] ProcessGroupNCCL initialization options: size: 8, global rank: {rank}, TIMEOUT(ms): 600000",
    "W{md} {hms}.{ns} {pid} torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded",
    "E{md} {hms}.{ns} {pid} torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: {rank} (pid: {pid}) of binary: /opt/conda/bin/python3.11",
    "torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process {pid} closing signal SIGTERM",
    "  error_file: /tmp/torchelastic_{tag}/none_{tag2}/attempt_0/{rank}/error.json",
    "[{date} {hmsc},{ms}] torch.distributed.run: [WARNING] *****************************************",
)


def _distributed(rng: _Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        torch, cu, cuda, libs = rng.choice(_CUDA_STACKS)
        fields = {
            "drv": rng.choice((12020, 12040, 12060, 12080, 13000)), "nccl": libs["nccl"], "cuda": cuda,
            "ptr": "55" + rng.hex(10), "rank": rng.randint(0, 7), "peer": rng.randint(0, 7),
            "bus": rng.choice(("18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000")),
            "comm": rng.hex(16), "ch": rng.randint(0, 23), "md": f"{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}",
            "hms": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
            "hmsc": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
            "ns": f"{rng.randint(0, 999999999):09d}", "pid": rng.randint(100, 4194304), "ms": f"{rng.randint(0, 999):03d}",
            "date": rng.stamp()[0], "tag": rng.word(_LOWER_ALNUM + "_", 8), "tag2": rng.word(_LOWER_ALNUM + "_", 8),
        }
        pid, tid = rng.randint(100, 4194304), rng.randint(100, 4194304)
        info = rng.choice(_NCCL_INFO).format(**fields)
        text = f"{HOST}:{pid}:{tid} [{fields['rank']}] {info}"
        out.append(("nccl", text, f"<host>:{pid}:{tid} [{fields['rank']}] {info}"))
        out.append(("nccl", f"[rank{fields['rank']}]: {info}"))
        out.append(("torch.distributed", rng.choice(_TORCH_DIST).format(**fields)))
    return out


def _modules(rng: _Random, paths: list[str]) -> list[tuple[str, str]]:
    """Dotted module names of the installed .py files, as imports, loggers and errors print them."""
    out = []
    for path in paths:
        if not path.endswith(".py") or not path[0].isalpha() or "-" in path:
            continue
        mod = path[:-3].replace("/", ".").removesuffix(".__init__")
        pkg, _, name = mod.rpartition(".")
        out.append(("modules", rng.choice([
            f"ModuleNotFoundError: No module named '{mod}'",
            f"from {pkg} import {name}" if pkg else f"import {mod}",
            f"<module '{mod}' from '{_site_packages(rng)}/{path}'>",
            f"WARNING:{mod}:{rng.choice(_WARNINGS)}",
            f"[2026-11-25 06:02:20,123] [INFO] [{mod}] rank 0 ready",
        ])))
    return out


# State-dict keys as models name their weights, for the messages that print them.
_STATE_KEYS = (
    "model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.mlp.down_proj.weight", "model.embed_tokens.weight",
    "lm_head.weight", "transformer.h.{i}.attn.c_attn.weight", "unet.down_blocks.{i}.attentions.0.transformer_blocks.0.attn1.to_k.weight",
    "first_stage_model.decoder.up.{i}.block.1.conv2.bias", "model.diffusion_model.input_blocks.{i}.1.proj_in.weight",
    "blocks.{i}.cross_attn.k.weight", "vision_model.encoder.layers.{i}.self_attn.k_proj.bias",
)


def _keys(rng: _Random, n: int) -> list[tuple[str, str]]:
    """Messages of torch, transformers and accelerate that print a key or a token that is no
    secret: cache keys, state-dict keys, store keys, tokenizer tokens (message templates from
    torch/_inductor/codecache.py, torch/nn/modules/module.py, transformers' modeling_utils.py and
    generation/utils.py, torch/distributed/elastic)."""
    out = []
    for _ in range(n):
        key = rng.choice(_STATE_KEYS).format(i=rng.randint(0, 47))
        fx = "f" + rng.word(_B32_LOWER, 51)
        out += [
            ("keys", f"fx graph cache hit for key {fx}"),
            ("keys", f"fx graph cache miss for key {fx}"),
            ("keys", f"No cached result found for key: {fx}"),
            ("keys", f"source tensor size=torch.Size([4096, 4096]) dtype=torch.bfloat16 for key {key}"),
            ("keys", f'Missing key(s) in state_dict: "{key}", "{rng.choice(_STATE_KEYS).format(i=rng.randint(0, 47))}".'),
            ("keys", f"size mismatch for {key}: copying a param with shape torch.Size([32000, 4096]) from checkpoint, the shape in current model is torch.Size([32001, 4096])."),
            ("keys", f"KeyError: '{key}'"),
            ("keys", f"Some weights of the model checkpoint at {rng.choice(_HF_REPOS)} were not used when initializing LlamaForCausalLM: ['{key}']"),
            ("keys", f"Setting `pad_token_id` to `eos_token_id`:{rng.randint(2, 128009)} for open-end generation."),
            ("keys", f"Token indices sequence length is longer than the specified maximum sequence length for this model ({rng.randint(513, 9000)} > 512)."),
            ("keys", f"rank {rng.randint(0, 7)}, for key: /default_pg/{rng.randint(0, 9)}//cuda//{rng.randint(0, 99)} (world_size=8, timeout=0:30:00)"),
        ]
    return out


# Source lines as a traceback shows them under `File "...", line N, in f`, in the idioms of torch,
# transformers, diffusers and huggingface_hub: names that say token, key, secret, auth, host or node
# beside values that are a program's expressions, not literals. Written for this corpus after the
# lines of those packages that an earlier redactor hid (95,587 of their lines with such a word:
# 27,938 changed, and `self`, `config` and `accelerate` hunted through the whole report).
_SOURCE_LINES = (
    'token = kwargs.pop("token", None)',
    'token = kwargs.get("use_auth_token", token)',
    "tokenizer.pad_token = tokenizer.eos_token",
    "self.pad_token_id = pad_token_id",
    "if token == self.image_token:",
    'assert tokenizer.cls_token == "<CLS>"',
    "self.audio_token = audio_token",
    "self._mask_token = value",
    'self.image_newline_token = "<|image_newline|>"',
    "key = tokens[0]",
    "token = tokens[i]",
    "vocab[token] = index",
    "positions = {token: -index for index, token in enumerate(tokens)}",
    'hf_token = os.environ.get("HF_TOKEN")',
    'token = os.environ["HF_TOKEN"]',
    'extended_environ["HF_TOKEN"] = token',
    'fields = {"hf_token": token}',
    '"token": hf_token,',
    "token=hf_token,",
    'headers = {"authorization": f"Bearer {token}"}',
    '"Authorization": f"Bearer {get_token()}",',
    'ENV_HF_TOKEN = "HF_TOKEN"',
    'master_addr = os.environ["MASTER_ADDR"]',
    "hostname = socket.gethostname()",
    "hostname=hostname,",
    "master_addr = args.master_addr",
    'rdzv_endpoint = f"{master_addr}:{master_port}"',
    'node = self.graph.create_node("call_function", target, args, kwargs)',
    "node_c = cur_match[1][1]",
    "for node in graph.nodes:",
    "    node: torch.fx.Node,",
    "nodes: list[torch.fx.Node] = []",
    "node_list = snode.get_nodes()",
    "cur_nodes_list: NodeList = nodes[: mid + 1] if find_last_node else nodes[mid:]",
    "outer_node=node1,",
    "node = node1",
    "host = self.host",
    "server = self._server",
    "store = dist.TCPStore(host_name=master_addr, port=port, world_size=world_size, is_master=rank == 0)",
    "return RendezvousStoreInfo(master_addr=addr, master_port=port)",
    "cache_key = self._cache_key(inputs)",
    "key = jax.random.PRNGKey(0)",
    "def _get_storage_size(self, storage_key: StorageKey) -> int:",
    "serialized_storages[storage_key] = storage",
    "pad_token: AddedToken | str | None = None,",
    "token: TextGenerationStreamOutputToken",
    "key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)",
    "attn_output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)",
    "password = getpass.getpass()",
    "secret = self.config.secret",
    'api_key = api_key or os.environ.get("OPENAI_API_KEY")',
    "client_secret=constants.OAUTH_CLIENT_SECRET,",
    "substituted_api_key = raw_api_key",
    'config["apiKey"] = substituted_api_key',
    "self.auth = auth",
    "auth=self.auth,",
    'new_key = key.replace("model.", "")',
    "state_dict[new_key] = state_dict.pop(key)",
    'FORMAT_KEY = "format"',
    'OUTPUT_DTYPE_DICT_KEY = "output_dtype"',
    'CUSTOM_METADATA_KEY = "DCP_SHARDING_INFO"',
    'key = "down_blocks.1.attentions.0"',
    'return {"token": token, "expires_at": expires_at}',
    "self.num_keys = math.floor(math.sqrt(self.num_experts))",
    "split_tokens = self.wordpiece_tokenizer.tokenize(text)",
    "min_new_tokens = generation_config.min_new_tokens",
    "def refresh_access_token(refresh_token: str) -> OAuthTokenResponse:",
    "return self.current_tracer.create_node(*args, **kwargs)",
    "def __init__(self, image_processor=None, tokenizer=None, **kwargs):",
    "torch.fx.node.has_side_effect(torch.ops._c10d_functional.wait_tensor.default)",
    "from torch.fx.node import _get_qualified_name, Node",
    "from sklearn.cluster import KMeans",
    "from accelerate.commands.config.cluster import get_cluster_input",
    "local_map = torch.distributed.tensor.experimental.local_map",
    "lambda input, msg, dep_token: -1,",
    "semantic_infer_token=129_599,",
    "Pass --token for a non-interactive login.",
    "--master-addr and --master-port must be given together",
    "pipe.load_textual_inversion(\"./charturnerv2.pt\", token=\"charturnerv2\")",
    "out = h@self.proj.weight",
    "inline c10::complex<float> convert(float value) {",
    "class Apertus1p5VisionTokenizerModel(Apertus1p5VisionTokenizerPreTrainedModel):",
    'WARNING:huggingface_hub.utils._auth:Token has not been saved to git credential helper.',
)
_SOURCE_FILES = ("transformers/tokenization_utils_base.py", "torch/fx/graph.py", "torch/distributed/rendezvous.py",
                 "diffusers/loaders/textual_inversion.py", "huggingface_hub/utils/_auth.py", "torch/_inductor/scheduler.py")


def _source(rng: _Random) -> list[tuple[str, str]]:
    out = []
    for line in _SOURCE_LINES:
        out.append(("source", "    " + line))
        frame = f'  File "{_site_packages(rng)}/{rng.choice(_SOURCE_FILES)}", line {rng.randint(1, 4000)}, in {rng.choice(_FUNCS)}'
        out.append(("source", f"{frame}\n    {line}"))
    return out


def corpus() -> list[tuple[str, str, str]]:
    """Every (family, text, expected) of the precision corpus. Each part draws from its own seeded
    generator: the same strings on every machine, and the parts built from the distributions'
    files do not move when this repository gains a file."""
    def rng(part: str) -> _Random:
        return _Random(f"20261125-{part}")  # a str seed is hashed with SHA-512: no PYTHONHASHSEED

    dist = distribution_paths()
    entries: list[tuple[str, ...]] = []
    entries += _installed(rng("installed"), dist)
    entries += _checkouts(rng("checkouts"), repository_paths())
    entries += _hf_caches(rng("huggingface"), 3000)
    entries += _other_caches(rng("caches"), 3000)
    entries += _versions(rng("versions"), 150)
    entries += _shapes(rng("shapes"), 300)
    entries += _nvidia_smi(rng("nvidia-smi"), 150)
    entries += _distributed(rng("distributed"), 600)
    entries += _modules(rng("modules"), dist)
    entries += _keys(rng("keys"), 200)
    entries += _source(rng("source"))
    return [(e[0], e[1], e[2] if len(e) > 2 else e[1]) for e in entries]


if __name__ == "__main__":  # print the corpus, one entry per line (for a look or a diff)
    for family, text, _ in corpus():
        print(family, text.replace("\n", "\\n"), sep="\t")
