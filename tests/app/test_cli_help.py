"""Every command's --help prints (argparse formats each help string with %: a bare '%' in one
turns --help into a traceback)."""

import pytest

from app.cli import build_parser, main


def _commands():
    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return [None] + sorted(subs.choices)


@pytest.mark.parametrize("command", _commands())
def test_help_prints(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(([command] if command else []) + ["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: localchat")


def test_every_subcommand_comes_from_the_one_table_and_its_handler_imports():
    """The parser's subcommands are exactly app.cli.COMMANDS, and each "module:function" resolves."""
    import argparse

    from app.cli import COMMANDS, build_parser, handler_for

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [c.name for c in COMMANDS]
    for command in [None] + [c.name for c in COMMANDS]:
        assert callable(handler_for(command))
