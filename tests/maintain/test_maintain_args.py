"""Mistakes on the command lines of `mmcurate remove`, `retry` and `append` (a missing
argument, an unknown flag, two selectors at once) are one line on stderr and exit 2, as a bad
config is; `--help` still prints its usage and exits 0."""

from __future__ import annotations

import pytest
from mmcurate.pipeline.cli import main

CASES = [
    (["remove"], "mmcurate remove: the following arguments are required: output"),
    (["remove", "out"], "one of the arguments --keys --urls --sha256 --like is required"),
    (["remove", "out", "--keys", "a", "--urls", "b"], "not allowed with argument"),
    (["remove", "out", "--keys", "a", "--bogus"], "unrecognized arguments: --bogus"),
    (["retry"], "mmcurate retry: the following arguments are required: output"),
    (["retry", "out", "--bogus"], "unrecognized arguments: --bogus"),
    (["append", "out"], "mmcurate append: the following arguments are required: config"),
    (["append", "out", "c.yaml", "--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize(("argv", "message"), CASES)
def test_a_command_line_mistake_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and message in err and "--help" in err
    assert captured.out == ""


@pytest.mark.parametrize("command", ["remove", "retry", "append"])
def test_help_prints_the_usage_and_exits_0(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: mmcurate {command}")
