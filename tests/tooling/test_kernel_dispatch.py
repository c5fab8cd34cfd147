"""bench/kernels' dispatch (fp4_kernels.DISPATCH): well-formed, and read as measured."""

from __future__ import annotations

import re
from types import SimpleNamespace

import fp4_kernels as fk
import pytest
import torch

PATH = re.compile(r"(gemv(_ws)?|marlin|prefill(_overlap)?(@\d+M)?)")


@pytest.mark.parametrize("shape", sorted(fk.DISPATCH))
def test_each_dispatch_is_ordered_and_open_ended(shape: str) -> None:
    entries = fk.DISPATCH[shape]
    uppers = [upper for upper, _ in entries]
    assert uppers == sorted(set(uppers)) and uppers[-1] == fk.OPEN_END
    assert all(PATH.fullmatch(path) for _, path in entries)
    assert all(a[1] != b[1] for a, b in zip(entries, entries[1:], strict=False))


def _path(shape: str, m: int) -> str:
    return fk.Fp4Linear.path_for(SimpleNamespace(dispatch=fk.dispatch_for(shape)), m)


def test_paths_between_measured_points_go_to_the_next_path() -> None:
    dispatch = [(2, "gemv_ws"), (8, "gemv"), (64, "marlin"), (fk.OPEN_END, "prefill@64M")]
    table = SimpleNamespace(dispatch=dispatch)
    assert [fk.Fp4Linear.path_for(table, m) for m in (1, 2, 3, 8, 9, 64, 65, 1 << 20)] == [
        "gemv_ws", "gemv_ws", "gemv", "gemv", "marlin", "marlin", "prefill@64M", "prefill@64M",
    ]  # fmt: skip


def test_shapes_not_timed_keep_marlin_to_64() -> None:
    assert fk.dispatch_for("not_a_shape") == fk.dispatch_for() == fk.DISPATCH["*"]
    assert [_path("not_a_shape", m) for m in (1, 64, 65)] == ["marlin", "marlin", "prefill"]


class _Lib:
    """fp4_gemv_loader as the library answers on SM90: 0 ring, 2 the workspace end, else copy."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def fp4_gemv_loader(self, which: int) -> int:
        self.calls.append(which)
        return {0: 0, 2: 2}.get(which, 1)


def _kernels() -> fk.Kernels:
    k = fk.Kernels.__new__(fk.Kernels)  # no library: the loader bookkeeping only
    k.lib, k.asked = _Lib(), -1
    return k


def test_using_restores_the_loader_asked_before_it() -> None:
    k = _kernels()
    with k.using(0) as outer:
        with k.using(2) as inner:
            assert (outer, inner, k.asked) == ("ring", "copy-ws", 2)
        assert k.asked == 0
    assert k.asked == -1 and k.lib.calls[-1] == -1


def test_gemv_ws_path_runs_the_workspace_end_and_restores_the_loader() -> None:
    lin = fk.Fp4Linear.__new__(fk.Fp4Linear)
    lin.k, lin.dispatch = _kernels(), [(2, "gemv_ws"), (fk.OPEN_END, "gemv")]
    seen: list[int] = []
    lin.gemv = lambda x: seen.append(lin.k.asked) or x  # type: ignore[method-assign]
    with lin.k.using(0):
        lin(torch.zeros(2, 8))  # gemv_ws
        lin(torch.zeros(3, 8))  # gemv, with the loader of the caller
    assert seen == [2, 0] and lin.k.asked == -1
