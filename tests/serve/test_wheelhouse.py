"""The wheelhouse builder's offline parts and the committed lock (serve/make_wheelhouse.py)."""

import re
import zipfile
from pathlib import Path

import make_wheelhouse as mw
import pytest

LOCK = Path(__file__).resolve().parents[2] / "serve" / "wheelhouse.lock"
PIN_LINE = re.compile(r"^([a-z0-9][a-z0-9-]*)==(\S+) --hash=sha256:([0-9a-f]{64})$")


def lock_pins():
    pins, comments = {}, []
    for line in LOCK.read_text().splitlines():
        if line.startswith("#") or not line:
            comments.append(line)
            continue
        m = PIN_LINE.match(line)
        assert m, f"not a hash-pinned line: {line!r}"
        assert m.group(1) not in pins, f"{m.group(1)} pinned twice"
        pins[m.group(1)] = (m.group(2), m.group(3))
    return pins, comments


def test_the_committed_lock_is_hash_pinned_and_leaves_out_what_it_says():
    pins, comments = lock_pins()
    assert pins["sglang-kernel"][0] == mw.KERNEL_VERSION
    assert pins["transformers"][0] == "5.6.0"  # the pin's, not the host image's 5.17.0
    left_out = {}
    for line in comments:
        m = re.match(r"^#   ([a-z0-9-]+): (.*)$", line)
        if m:
            left_out[m.group(1)] = m.group(2)
    assert left_out, "the lock lists no left-out requirement"
    for name, why in left_out.items():
        assert name in mw.LEFT_OUT, f"{name} left out without a reason in LEFT_OUT"
        # a left-out requirement is absent unless the lock says a dependency brings it back
        assert (name in pins) == ("YET IN THE WHEELHOUSE" in why), name
    for name in mw.HOST:
        assert name not in pins, f"{name} is in the host image, not the wheelhouse"
    assert "flashinfer-cubin" in left_out and "flashinfer-python" in pins


def fake_kernel(path: Path, drop=tuple(mw.KERNEL_DROP)) -> Path:
    info = "sglang_kernel-0.4.2.dist-info"
    files = {"sgl_kernel/__init__.py": b"x = 1\n", "sgl_kernel/sm90/common_ops.abi3.so": b"\0" * 99}
    files.update({name: b"\1" * 1000 for name in drop})
    files[f"{info}/METADATA"] = b"Name: sglang-kernel\nVersion: 0.4.2\n"
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items())
    record += f"{info}/RECORD,,\n"
    wheel = path / "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2025, 1, 1, 0, 0, 0)), data)
        zf.writestr(zipfile.ZipInfo(f"{info}/RECORD", (2025, 1, 1, 0, 0, 0)), record)
    return wheel


def test_repack_drops_the_objects_and_their_record_lines_reproducibly(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    wheel = fake_kernel(src)
    outs = []
    for name in ("a", "b"):
        dest = tmp_path / name
        dest.mkdir()
        out, dropped = mw.repack_kernel(wheel, dest)
        outs.append(out.read_bytes())
        assert dropped == {name: 1000 for name in mw.KERNEL_DROP}
    assert outs[0] == outs[1], "same input, different bytes"
    with zipfile.ZipFile(tmp_path / "a" / wheel.name) as zf:
        names = set(zf.namelist())
        record = zf.read("sglang_kernel-0.4.2.dist-info/RECORD").decode()
        assert zf.read("sgl_kernel/sm90/common_ops.abi3.so") == b"\0" * 99
    assert not names & set(mw.KERNEL_DROP)
    assert "sgl_kernel/sm90/common_ops.abi3.so" in names
    for dropped_name in mw.KERNEL_DROP:
        assert dropped_name not in record
    assert "sgl_kernel/__init__.py" in record


def test_repack_refuses_a_kernel_of_another_layout(tmp_path):
    wheel = fake_kernel(tmp_path, drop=("sgl_kernel/flash_ops.abi3.so",))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(mw.WheelhouseError, match="not the 0.4.2 layout"):
        mw.repack_kernel(wheel, out)
    assert not list(out.iterdir()), "a partial wheel was left behind"


def test_runtime_requirements_drop_extras_and_flag_false_markers(tmp_path):
    meta = (
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.11\n"
        "Requires-Dist: torch==2.11.0\n"
        'Requires-Dist: decord2; sys_platform == "linux" and platform_machine == "aarch64"\n'
        'Requires-Dist: pytest; extra == "test"\n'
    )
    wheel = tmp_path / "sglang-0.5.11-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang-0.5.11.dist-info/METADATA", meta)
    reqs = mw.runtime_requirements(wheel)
    assert reqs[0] == "torch==2.11.0"
    assert reqs[1].startswith("decord2") and reqs[1].endswith("# marker false on the host")
    assert len(reqs) == 2


def test_host_stand_ins_carry_only_metadata(tmp_path):
    mw.stub_wheel(tmp_path, "huggingface-hub", "1.33.0")
    (wheel,) = tmp_path.iterdir()
    assert wheel.name == "huggingface_hub-1.33.0+host-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        assert all(".dist-info/" in n for n in zf.namelist())
        meta = zf.read("huggingface_hub-1.33.0+host.dist-info/METADATA").decode()
    assert "Version: 1.33.0+host" in meta and "Requires-Dist" not in meta


def test_parts_respect_the_size_limit_and_join_restores_every_byte(tmp_path):
    sizes = [5, 3, 3, 2, 13, 1]  # MiB; the 13 MiB wheel is cut into chunks
    originals = {}
    files = []
    for i, mb in enumerate(sizes):
        f = tmp_path / f"w{i}.whl"
        data = bytes([i]) * (mb << 20) + bytes(range(i + 1))
        f.write_bytes(data)
        originals[f.name] = data
        files.append(f)
    parts = mw.split_parts(tmp_path, files, part_mb=6)
    for i in range(1, len(parts) + 1):
        assert sum(f.stat().st_size for f in (tmp_path / f"part-{i}").iterdir()) <= 6 << 20
    assert not list(tmp_path.glob("*.whl")), "every wheel moved into a part"
    assert mw.join_parts(tmp_path) == len(sizes)
    assert {f.name: f.read_bytes() for f in tmp_path.glob("*.whl")} == originals
    assert not list(tmp_path.glob("part-*"))
