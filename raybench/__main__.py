"""`raybench COMMAND`: every raybench command behind one name, as `ray`, `vllm bench` and
`torchrun` are used (`python -m raybench COMMAND` is the same).

Each command is also its own module, as the README has always given them (`python -m
raybench.sweep`, `python -m raybench.compare`, ...), and `python -m raybench SWEEP.yaml`, with
no command, still runs the sweep. This module only dispatches: a command's options are its own.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from raybench import console

# name -> (module with main(argv, prog), what it does): one line each in `raybench --help`
COMMANDS: dict[str, tuple[str, str]] = {
    "sweep": ("raybench.sweep.command", "run a sweep file's trials, a row each, then the report"),
    "compare": ("raybench.compare", "is a run (or the history's latest) slower than another?"),
    "validate": ("raybench.validate.command", "is every GPU healthy and as fast as it should be?"),
    "report": ("raybench.report.__main__", "the HTML report of runs, a results root or a history"),
    "bench": ("raybench.bench.command", "benchmarks of raybench itself; `bench run`: in-process"),
    "history": ("raybench.results.history", "export the history under a results root as CSV"),
    "rebuild": ("raybench.results.rebuild", "write a damaged results table again from its trials"),
    "import": ("raybench.results.imported", "MLPerf LoadGen, vLLM bench serve or AIPerf results "
               "as rows"),
    "chips": ("raybench.data.chip", "cut xView3 scenes into chips on Ray Data"),
}


def _parser() -> argparse.ArgumentParser:
    """For `raybench --help` and a wrong command only: the commands parse their own options."""
    p = console.parser("raybench", "raybench: benchmark sweeps of GPU and HPC systems on Ray.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help) in COMMANDS.items():
        sub.add_parser(name, help=help, add_help=False)
    p.epilog = "`raybench COMMAND --help` lists a command's options."
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        module, _ = COMMANDS[argv[0]]
        return importlib.import_module(module).main(argv[1:], prog=f"raybench {argv[0]}")
    if any(a.endswith((".yaml", ".yml")) for a in argv):  # `python -m raybench SWEEP.yaml`
        from raybench.sweep.command import main as sweep  # the sweep's imports: only here

        return sweep(argv, prog="python -m raybench")  # as before there were commands
    _parser().parse_args(argv)  # prints the help (exit 0) or the usage error (exit 2)
    return 2


def run() -> None:
    """The `raybench` console script."""
    code = main()
    from raybench import cli  # loaded by the command by now; `raybench --help` spares it

    cli.exit(code)


if __name__ == "__main__":
    run()
