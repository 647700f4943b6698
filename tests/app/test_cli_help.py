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
