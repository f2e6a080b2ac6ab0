"""DeepSpeed's own estimate of the model states per GPU, shown beside the memory plan's.

DeepSpeed ships estimators for ZeRO-2 and ZeRO-3 (`estimate_zero2/3_model_states_mem_needs_all_cold`
print a table of every offload option; the functions they print from return the numbers).
The plan uses the row without offload. ZeRO-0 and ZeRO-1 have none.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys

GIB = 2 ** 30


def model_states_gib(zero_stage: int, params: int, largest_layer: int,
                     world_size: int) -> tuple[float, str] | None:
    """(GiB per GPU, which estimator) for weights, gradients and optimizer states without
    offload, or None where DeepSpeed has no estimator. Its GPU figure depends on the total
    GPU count only, so the ranks are passed as one node."""
    if zero_stage not in (2, 3):
        return None
    stage3, stage2 = _estimators()
    if zero_stage == 3:
        _, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
            total_params=params, largest_layer_params=largest_layer, num_gpus_per_node=world_size,
            num_nodes=1, cpu_offload=False, cpu_offload_params=False, zero_init=True)
        return gpu / GIB, "DeepSpeed estimate_zero3_model_states_mem_needs (no offload)"
    _, gpu = stage2.estimate_zero2_model_states_mem_needs(
        total_params=params, num_gpus_per_node=world_size, num_nodes=1, cpu_offload=False)
    return gpu / GIB, "DeepSpeed estimate_zero2_model_states_mem_needs (no offload)"


def _estimators():
    """DeepSpeed's estimator modules. Importing DeepSpeed the first time logs its accelerator
    choice to stdout, which carries the dry run's YAML or JSON: that import's output is
    dropped and DeepSpeed's logger is pointed at stderr."""
    if "deepspeed" in sys.modules:
        from deepspeed.runtime.zero import stage3, stage_1_and_2
        return stage3, stage_1_and_2
    chatter = io.StringIO()
    with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
        import deepspeed
        from deepspeed.runtime.zero import stage3, stage_1_and_2
    for handler in deepspeed.utils.logger.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is chatter:
            handler.setStream(sys.__stderr__)
    return stage3, stage_1_and_2
