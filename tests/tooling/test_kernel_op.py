"""bench/kernels' ``fp4k::linear`` op: what torch.compile(fullgraph=True) needs of it, on CPU.

The op calls a registered layer; here the layer is a plain matmul (the kernels need a GPU:
``bench/kernels/compile_check.py`` runs the real ones compiled), so these tests check the
op's plumbing: its fake implementation agrees with the real one (``opcheck``), and a module
calling it compiles as one graph and gives the eager result.
"""

from __future__ import annotations

import fp4_kernels as fk
import pytest
import torch


def _matmul_layer(n: int, k: int, seed: int) -> tuple[torch.Tensor, int]:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return w, fk.register(lambda x, w=w: x @ w.t(), n)


def test_op_matches_its_fake_implementation() -> None:
    _, handle = _matmul_layer(48, 32, 0)
    torch.library.opcheck(torch.ops.fp4k.linear.default, (torch.randn(5, 32), handle))


class _TwoLayers(torch.nn.Module):
    def __init__(self, h1: int, h2: int) -> None:
        super().__init__()
        self.h1, self.h2 = h1, h2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fp4k.linear(torch.relu(torch.ops.fp4k.linear(x, self.h1)), self.h2)


@pytest.mark.parametrize("m", [1, 7, 64])
def test_module_compiles_as_one_graph(m: int) -> None:
    w1, h1 = _matmul_layer(64, 32, 1)
    w2, h2 = _matmul_layer(16, 64, 2)
    module = _TwoLayers(h1, h2)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=False)
    x = torch.randn(m, 32)
    out = compiled(x)
    torch.testing.assert_close(out, torch.relu(x @ w1.t()) @ w2.t())
    assert len(graphs) == 1
    op = (torch.ops.fp4k.linear, torch.ops.fp4k.linear.default)  # the packet or its overload
    calls = [n for n in graphs[0].graph.nodes if n.op == "call_function" and n.target in op]
    assert len(calls) == 2
