"""bench/kernels' dispatch (fp4_kernels.DISPATCH): well-formed, and read as measured."""

from __future__ import annotations

import re
from types import SimpleNamespace

import fp4_kernels as fk
import pytest

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
