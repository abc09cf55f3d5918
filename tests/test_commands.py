"""One command for users (`raybench COMMAND`, raybench/__main__.py): every command behind it, each
module the README gives still its own command, and every `--help` an option a line."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

from raybench.__main__ import COMMANDS, main
from tests.conftest import ROOT

# `bench`'s own commands, each with its options
BENCH = ["run", "overhead", "forward-check", "chips", "history", "compare", "verdicts"]


def help_text(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What `raybench ARGV --help` prints on a terminal of 100 columns."""
    monkeypatch.setenv("COLUMNS", "102")  # argparse leaves two
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return out.getvalue()


def entries(text: str) -> list[str]:
    """The lines of the options and positional arguments sections."""
    lines, inside = [], False
    for line in text.splitlines():
        if line and not line.startswith(" "):  # a section's title, or the text after them
            inside = line in ("options:", "positional arguments:")
        elif inside and line.strip():
            lines.append(line)
    return lines


def wrapped(text: str) -> list[str]:
    """Entries whose help is not beside the option: wrapped onto a second line, or put under a
    long option on a line of its own; and options with no help at all."""
    bad = []
    for line in entries(text):
        if re.match(r" {8,}\S", line):  # a help line below its option
            bad.append(line)
        elif not re.match(r"( {2}| {4})\S+( \S+)*? {2,}\S", line) and line.strip() not in (
                "COMMAND", "COMMAND ..."):
            bad.append(line)  # an option with nothing beside it
    return bad


@pytest.mark.parametrize("argv", [[], *[[c] for c in COMMANDS],
                                  *[["bench", b] for b in BENCH]])
def test_every_help_lists_its_options_one_line_each(argv, monkeypatch):
    text = help_text(argv, monkeypatch)
    assert entries(text), text
    assert not wrapped(text), f"raybench {' '.join(argv)} --help:\n{text}"


def test_the_help_check_sees_a_wrapped_option():
    text = ("options:\n  -h, --help       show this help\n  --normalize {standard,reference}\n"
            "                   fixed statistics\n  --seed SEED\n")
    assert wrapped(text) == ["  --normalize {standard,reference}", "                   fixed "
                             "statistics", "  --seed SEED"]


def test_raybench_lists_its_commands_and_refuses_another(monkeypatch, capsys):
    text = help_text([], monkeypatch)
    for name in COMMANDS:
        assert re.search(rf"^ {{4}}{name} +\S", text, re.M), text
    with pytest.raises(SystemExit) as exit_:
        main(["nope"])
    assert exit_.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_each_command_dispatches_with_its_own_name(monkeypatch):
    """`raybench history` runs the history's own main, which tells its usage by this name."""
    monkeypatch.setenv("COLUMNS", "102")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(["history"])  # a required argument missing: the command's own usage error
    assert exit_.value.code == 2 and err.getvalue().startswith("usage: raybench history ")


def test_the_console_script_and_the_readme_modules_are_the_same_commands(capsys):
    """`raybench COMMAND` (the console script), and each module the README names run as
    `python -m` (one interpreter for all of them: a process each cost 48 s of a CI worker);
    `python -m raybench SWEEP.yaml` is still the sweep."""
    env = {**os.environ, "COLUMNS": "102"}
    script = os.path.join(os.path.dirname(sys.executable), "raybench")
    proc = subprocess.run([script, "rebuild", "--help"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: raybench rebuild"), proc.stderr
    modules = ["raybench", "raybench.sweep", "raybench.compare", "raybench.validate",
               "raybench.report", "raybench.bench", "raybench.history", "raybench.rebuild",
               "raybench.data.chip", "raybench.data.synth_xview3", "raybench.metrics.xview3"]
    runs = "\n".join(
        f"sys.argv = [{m!r}, *({'compare',} if {m!r} == 'raybench' else ()), '--help']\n"
        f"try:\n    runpy.run_module({m!r}, run_name='__main__', alter_sys=True)\n"
        f"except SystemExit as e:\n    print('EXIT', {m!r}, e.code, flush=True)"
        for m in modules)
    proc = subprocess.run([sys.executable, "-c", f"import runpy, sys\n{runs}"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    exits = re.findall(r"^EXIT (\S+) (\S+)$", proc.stdout, re.M)
    assert exits == [(m, "0") for m in modules], proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("usage: ") == len(modules)
    assert main([str(ROOT / "sweeps" / "local_cpu.yaml"), "--dry-run"]) == 0  # the sweep
    assert "4 trials" in capsys.readouterr().out
