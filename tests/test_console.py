"""The commands' stdout holds their JSON lines alone (console.py): whatever else is written
there while a command runs, from this process or a child, goes to stderr. Ray's own case (the
raylet's word of a dead worker) is in tests/reliability/test_faults_ray.py."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap

from raybench import console
from tests.conftest import ROOT

WRITERS = textwrap.dedent("""
    import os, subprocess, sys, threading
    from raybench import console

    print("before", flush=True)
    with console.held():
        print("a print")
        thread = threading.Thread(target=print, args=("a print from a thread",))
        thread.start()
        thread.join()
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        os.write(1, b"descriptor 1\\n")
        console.emit({"raybench": {"n": 1}})
        with console.held():  # nested, as `bench run` calls the sweep's main
            console.emit({"raybench_trial": {"n": 2}})
            print("nested")
    print("after")
""")


def test_only_the_json_lines_reach_stdout_while_a_command_holds_it():
    proc = subprocess.run([sys.executable, "-c", WRITERS], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["before", '{"raybench": {"n": 1}}',
                                        '{"raybench_trial": {"n": 2}}', "after"]
    for noise in ("a print", "a print from a thread", "a child process", "descriptor 1",
                  "nested"):
        assert noise in proc.stderr.splitlines(), noise


def test_a_stream_that_is_not_descriptor_1_is_swapped_not_moved(capsys):
    """A caller's redirect_stdout (the tests, a program embedding a command) gets the JSON
    lines; the descriptors are left alone, and sys.stdout is the caller's again after."""
    caught = io.StringIO()
    with contextlib.redirect_stdout(caught):
        with console.held():
            print("a print")
            console.emit({"raybench": {"path": ROOT}})  # default=str: a Path is written
        assert sys.stdout is caught
    assert [json.loads(x) for x in caught.getvalue().splitlines()] == [
        {"raybench": {"path": str(ROOT)}}]
    assert capsys.readouterr().err == "a print\n"
