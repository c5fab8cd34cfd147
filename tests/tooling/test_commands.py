"""The commands: one module a verb in fp4series.commands, one spelling for each shared option,
and an old spelling that still works for a while and says which to use, on one line."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest
from _fakepin import Env

from fp4series import cli
from fp4series.commands import COMMANDS

COMMANDS_DIR = Path(__file__).resolve().parents[2] / "src" / "fp4series" / "commands"


def test_every_command_module_registers_one_verb() -> None:
    assert sorted(p.stem for p in COMMANDS_DIR.glob("*.py") if p.stem != "__init__") == sorted(
        COMMANDS
    )
    for name in COMMANDS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"fp4series.commands.{name}").register(sub)
        assert len(sub.choices) == 1, (name, sorted(sub.choices))


def test_the_series_folder_is_patches_dir_everywhere() -> None:
    parser = cli.build_parser()
    verbs = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for verb, sub in verbs.items():
        shown = {o for a in sub._actions if a.help != argparse.SUPPRESS for o in a.option_strings}
        assert "--patches" not in shown and "--source-patches" not in shown, verb
        assert "--allow-mismatched-base" not in shown, verb


@pytest.mark.parametrize(
    ("argv", "old", "new"),
    [
        (["lint", "--patches", "{patches}"], "--patches", "--patches-dir"),
        (["lint", "--patches-dir", "{patches}"], None, None),
    ],
)
def test_an_old_spelling_works_and_says_which_to_use(
    env: Env, capsys: pytest.CaptureFixture, argv: list[str], old: str | None, new: str | None
) -> None:
    argv = [a.format(patches=env.patches) for a in argv] + ["--root", str(env.root)]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    if old is None:
        assert "deprecated" not in err
    else:
        assert err.count("deprecated") == 1
        assert f"warning: {old} is deprecated, use {new}" in err


def test_old_spellings_of_each_command_still_parse() -> None:
    parser = cli.build_parser()
    ns = parser.parse_args(["apply", "co", "--patches", "p", "--allow-base-mismatch"])
    assert ns.patches_dir == Path("p") and ns.allow_base_mismatch
    ns = parser.parse_args(["build", "co", "--allow-mismatched-base"])
    assert ns.allow_base_mismatch is True
    ns = parser.parse_args(["build", "co"])
    assert ns.allow_base_mismatch is False
    ns = parser.parse_args(["split", "repo", "--patches", "a", "b"])
    assert ns.only == ["a", "b"]
    ns = parser.parse_args(["rebase", "--to", "0.5.23", "--source-patches", "x"])
    assert ns.source_patches == Path("x")
