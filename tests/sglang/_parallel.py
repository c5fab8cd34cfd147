"""One rank of a tensor/expert-parallel group, as SGLang's layers see it, without process groups.

SGLang's parallel layers ask the parallel state for their rank and group sizes (FusedMoE and its
dispatcher through ``get_moe_*``; the linear layers take ``tp_rank`` / ``tp_size`` or ask
``get_tensor_model_parallel_*``) and FusedMoE reads the global server args. A test machine has
no process group, so ``use_ranks`` answers those questions for one rank and publishes a real
``ServerArgs`` (with the backends given) as the server would, then resolves the FP4 GEMM and
MoE runner backends from it with SGLang's own ``initialize_*_config``. Everything is undone by
the ``monkeypatch`` passed in. Used by the CPU tests' ``parallel_ranks`` fixture and by the GPU
tensor-parallel test.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

# Modules that import the parallel-state getters by name (each keeps its own reference).
GETTER_MODULES = (
    "sglang.srt.distributed",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.moe.fused_moe_triton.layer",
    "sglang.srt.layers.moe.token_dispatcher.standard",
)
# Module globals the backend initialisation writes; restored after the test.
_STATE_MODULES = (
    "sglang.srt.layers.moe.utils",
    "sglang.srt.layers.quantization.fp4_utils",
)


@dataclass(frozen=True)
class Ranks:
    """``--tp tp_size --ep ep_size``, seen from rank ``tp_rank`` (SGLang's MoE TP is tp / ep)."""

    tp_rank: int
    tp_size: int
    ep_size: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.tp_rank < self.tp_size) or self.tp_size % self.ep_size:
            raise ValueError(f"not a rank of --tp {self.tp_size} --ep {self.ep_size}: {self}")

    @property
    def moe_tp_size(self) -> int:
        return self.tp_size // self.ep_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank % self.moe_tp_size

    @property
    def ep_rank(self) -> int:
        return self.tp_rank // self.moe_tp_size

    def getters(self) -> dict[str, int]:
        return {
            "get_tensor_model_parallel_rank": self.tp_rank,
            "get_tensor_model_parallel_world_size": self.tp_size,
            "get_moe_expert_parallel_rank": self.ep_rank,
            "get_moe_expert_parallel_world_size": self.ep_size,
            "get_moe_tensor_parallel_rank": self.moe_tp_rank,
            "get_moe_tensor_parallel_world_size": self.moe_tp_size,
        }


def _keep_state(monkeypatch: Any) -> None:
    """Register every upper-case global of the backend modules for restoring."""
    for name in _STATE_MODULES:
        module = importlib.import_module(name)
        for attr, value in list(vars(module).items()):
            if attr.isupper() and not callable(value):
                monkeypatch.setattr(module, attr, value)


def use_ranks(monkeypatch: Any, ranks: Ranks, device: str = "cpu", **server_args: Any) -> Any:
    """Make SGLang see RANKS and the server args given; returns the published ServerArgs."""
    from sglang.srt import server_args as server_args_module
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.quantization import fp4_utils

    args = server_args_module.ServerArgs(
        model_path="dummy", tp_size=ranks.tp_size, ep_size=ranks.ep_size, **server_args
    )
    monkeypatch.setattr(server_args_module, "_global_server_args", args)
    _keep_state(monkeypatch)
    fp4_utils.initialize_fp4_gemm_config(args)
    moe_utils.initialize_moe_config(args)
    for name in GETTER_MODULES:
        module = importlib.import_module(name)
        for getter, value in ranks.getters().items():
            if hasattr(module, getter):
                monkeypatch.setattr(module, getter, lambda value=value: value)
    standard = importlib.import_module("sglang.srt.layers.moe.token_dispatcher.standard")
    # The dispatcher builds its expert map on SGLang's device ("cuda" on a CUDA build).
    monkeypatch.setattr(standard, "get_device", lambda device_id=None: device)
    return args
