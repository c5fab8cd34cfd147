"""How serve/scan_imports.py classifies import sites (the left-out table's evidence)."""

import textwrap

from scan_imports import import_sites, main


def tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / "sglang" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_module_level_try_if_function_and_type_checking(tmp_path):
    root = tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": """
                import flashinfer.sampling
                from typing import TYPE_CHECKING
                try:
                    import outlines
                except ImportError:
                    outlines = None
                if is_cuda():
                    from sgl_kernel import rmsnorm
                if TYPE_CHECKING:
                    import torchao
                def f():
                    import timm
                class C:
                    import xgrammar
            """,
        },
    )
    sites = import_sites(
        root, {"flashinfer", "outlines", "sgl_kernel", "torchao", "timm", "xgrammar"}
    )
    assert sites["flashinfer"]["unconditional"] == {"sglang.a"}
    assert sites["outlines"]["guarded"] == {"sglang.a"}
    assert sites["sgl_kernel"]["guarded"] == {"sglang.a"}
    assert not any(sites["torchao"].values()), "TYPE_CHECKING imports never run"
    assert sites["timm"]["lazy"] == {"sglang.a"}
    assert sites["xgrammar"]["unconditional"] == {"sglang.a"}  # class bodies run at import


def test_cli_refuses_a_folder_without_sglang(tmp_path, capsys):
    assert main([str(tmp_path), "flashinfer"]) == 2
    assert "no sglang package" in capsys.readouterr().err
