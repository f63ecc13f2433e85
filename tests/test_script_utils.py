"""Process-level plumbing of the training scripts (`seqbert.script_utils`)."""

import platform
import resource
import subprocess
import sys
import textwrap

import pytest


# Allocates, touches and frees a 64 MiB tensor five times after three warm-ups (the first may need room in a fresh
# part of the heap), and prints the minor page faults each time cost, in pages: glibc's default serves it with a fresh
# mmap every time. Transparent huge pages are off for the process (prctl PR_SET_THP_DISABLE), so a fault is one base
# page whatever the machine's THP setting.
PAGE_FAULTS = textwrap.dedent(
    """
    import ctypes, resource, sys, torch
    from seqbert.script_utils import reuse_freed_memory
    assert ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0
    if sys.argv[1] == "reuse":
        assert reuse_freed_memory() is True
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        torch.ones(64 << 18)
    before = faults()
    for _ in range(5):
        torch.ones(64 << 18)
    print((faults() - before) / 5)
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's (Linux)")
def test_reuse_freed_memory_stops_page_faults_on_large_tensors():
    def faults(mode: str) -> float:
        run = subprocess.run([sys.executable, "-c", PAGE_FAULTS, mode], capture_output=True, text=True, check=True)
        return float(run.stdout.split()[-1])

    pages = (64 << 20) / resource.getpagesize()
    assert faults("default") >= 0.9 * pages  # faulted in again on every allocation
    assert faults("reuse") < 0.01 * pages
