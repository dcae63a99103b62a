"""What a figure was measured on: the machine (CPU model, cores, instruction-set flags), the software
and the commit. Machines differ (the same code gave 1.47x on one 2-core CPU, 0.89x on another):
every run records this, and figures from different machines are never compared."""

import os
import platform
import subprocess

import onnxruntime
import torch

# flags that decide CPU matmul speed (fp32 / bf16 / int8 kernels)
_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def cpu() -> dict:
    """The CPU as /proc/cpuinfo names it, and which of the flags that matter it has."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in _FLAGS if f in flags]}


def environment() -> dict:
    """What the numbers were measured on."""
    return {
        "cpu": cpu(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "onnxruntime": onnxruntime.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_commit": git_commit(),
    }


def git_commit() -> str | None:
    """The checkout's commit, with `+dirty` when the working tree differs from it; for a copied tree
    that is no git checkout of it (a device machine's copy), what HETSPEC_GIT_COMMIT says."""
    if os.environ.get("HETSPEC_GIT_COMMIT"):
        return os.environ["HETSPEC_GIT_COMMIT"]
    try:
        here = os.path.dirname(__file__)
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=here).stdout.strip()
        return (out + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None
