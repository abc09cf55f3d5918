"""The commands' stdout, kept for their JSON lines.

`python -m raybench.sweep` (its `--jsonl` lines and the closing `{"raybench": ...}`),
`bench`, `validate` and the chip CLI (`python -m raybench.data.chip`) write machine-readable
lines on stdout, and pipelines read them there.
Anything else that reaches stdout while a command runs breaks such a reader, and Ray's driver
writes there whatever `log_to_driver` says: a thread of its own prints the raylet's messages to
`sys.stdout` ("(raylet) A worker died or was killed while executing a task ...", "8 PYTHON worker
processes have been started ..."), coloured. Ranks that the local runner spawns inherit file
descriptor 1 as well. So while a command holds stdout (`held`), its JSON lines go out through
`emit`, and everything else written to stdout goes to stderr. Also the commands' argument
parsers (`parser`), whose `--help` lists each option on one line. Imports nothing of raybench.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_lines: TextIO | None = None  # where emit writes while a command holds stdout
HELP_AT = 34  # the help column: raybench's longest option with its metavar fits before it


class _Formatter(argparse.HelpFormatter):
    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        # Python 3.11's formatter measures a subcommand's name at its parent's indent, two
        # columns short: the longest name (`bench forward-check`) then wrapped onto two lines
        subs = list(self._iter_indented_subactions(action))
        if subs and action.help is not argparse.SUPPRESS:
            longest = max(len(self._format_action_invocation(s)) for s in subs)
            self._action_max_length = max(self._action_max_length, longest
                                          + self._current_indent + self._indent_increment)


def formatter(prog: str) -> argparse.HelpFormatter:
    return _Formatter(prog, max_help_position=HELP_AT)


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command's argument parser (`prog`: how the user called it, `raybench sweep` or
    `python -m raybench.sweep`); its `--help` lists each option on one line, for a terminal of
    100 columns (the options' help is kept that short)."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=formatter)


def emit(record: dict[str, Any]) -> None:
    """One JSON line on the command's stdout."""
    print(json.dumps(record, default=str), file=_lines or sys.stdout, flush=True)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """For the block's length only `emit` reaches stdout; the rest goes to stderr.

    Where stdout is this process's file descriptor 1 (a command run from a shell), the
    descriptor itself is pointed at stderr, so child processes and C code follow, and emit
    writes to a copy of the original. Where it is something else (a test's redirect_stdout, an
    embedding program's stream), only `sys.stdout` is swapped: the descriptors are not this
    code's to move. Nested blocks (`bench run` calls the sweep's main) hold it once."""
    global _lines
    if _lines is not None:
        yield
        return
    out = sys.stdout
    out.flush()
    try:
        own_fd = out.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: a StringIO
        own_fd = False
    if own_fd:
        saved = os.dup(1)
        _lines = os.fdopen(os.dup(saved), "w", encoding=out.encoding or "utf-8")
        os.dup2(2, 1)
    else:
        _lines = out
        sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stderr.flush()
        if own_fd:
            out.flush()  # what went to descriptor 1 meanwhile: stderr
            _lines.close()
            os.dup2(saved, 1)
            os.close(saved)
        else:
            sys.stdout = out
        _lines = None
