"""memory.steady_heap: a heap that keeps what a step frees, whatever the process ran before, and
the user's own malloc settings left alone. Each case in a fresh interpreter: the settings are
process-wide and, once set, glibc's own adjustment of them is off for good."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# A training step's shape in a thread (Ray Train runs the trial's function in one, so its
# memory comes from a thread's arena of 64 MB heaps): activations of a few MB each, more in all
# than one heap holds, freed at the step's end. Prints the page faults of the last steps.
STEPS = """
import resource, sys, threading
from raybench.memory import steady_heap
if sys.argv[1] == "steady":
    print(steady_heap())
def steps():
    for n in range(12):
        if n == 4:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [bytearray(3 << 20) for _ in range(48)]  # 144 MB, every page written
        del blocks
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
t = threading.Thread(target=steps)
t.start()
t.join()
"""


def run(code: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_a_steady_heap_keeps_a_steps_pages_for_the_next():
    (default,) = run(STEPS, "default")
    fixed, steady = run(STEPS, "steady")
    assert fixed == "fixed"
    # 8 steps of 144 MB (36,864 pages each): glibc's default gave about half of them back and
    # faulted them in again every step (165,904 faults here); the steady heap none
    assert int(default) > 8 * 10_000
    assert int(steady) < 8 * 1_000


@pytest.mark.parametrize("setting", [
    {"MALLOC_TOP_PAD_": "1048576"}, {"MALLOC_ARENA_MAX": "2"},
    {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}])
def test_the_users_own_malloc_settings_stand(setting):
    code = "from raybench.memory import steady_heap; print(steady_heap())"
    assert run(code, env={**os.environ, **setting}) == ["user"]
