"""DeepSpeed's CPU shared-memory communication op: build once, check whether built.

The first `deepspeed.initialize` on a CPU machine JIT-compiles this op (about 5 minutes on
two cores) into torch's extension cache; `make setup` pays that once, so that training runs
and tests start in seconds. `python -m pipeline.train.ds_ops build` does it.
"""

from __future__ import annotations

import sys
from pathlib import Path

OP_NAME = "deepspeed_shm_comm"


def _build_dir() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(OP_NAME, verbose=False))


def comm_op_built() -> bool:
    """True when the compiled op is in torch's extension cache (or DeepSpeed is not on CPU)."""
    try:
        import torch

        if torch.cuda.is_available():
            return True
        return any(_build_dir().glob(f"{OP_NAME}*.so"))
    except Exception:  # noqa: BLE001 — a report, never a failure
        return False


def build() -> None:
    import os

    os.environ.setdefault("DS_BUILD_OPS", "0")
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ShareMemCommBuilder().load(verbose=False)


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        if comm_op_built():
            print("DeepSpeed CPU comm op: already built")
        else:
            build()
            print(f"DeepSpeed CPU comm op: built ({'ok' if comm_op_built() else 'NOT FOUND'})")
    else:
        print("built" if comm_op_built() else "not built")
