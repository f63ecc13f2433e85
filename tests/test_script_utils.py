"""Process-level plumbing of the training scripts (`seqbert.script_utils`)."""

import platform
import resource
import subprocess
import sys
import textwrap

import pytest


# Allocates, touches and frees a 64 MiB tensor five times after three warm-ups (the first may need room in a fresh
# part of the heap), and prints the minor page faults each time cost, in pages: first with glibc's defaults, which
# serve it with a fresh mmap every time, then after `reuse_freed_memory()` in the same process (one interpreter start
# instead of two; the settings only change how later allocations are served). Transparent huge pages are off for the
# process (prctl PR_SET_THP_DISABLE), so a fault is one base page whatever the machine's THP setting.
PAGE_FAULTS = textwrap.dedent(
    """
    import ctypes, resource, torch
    from seqbert.script_utils import reuse_freed_memory
    assert ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def per_allocation():
        for _ in range(3):
            torch.ones(64 << 18)
        before = faults()
        for _ in range(5):
            torch.ones(64 << 18)
        return (faults() - before) / 5

    default = per_allocation()
    assert reuse_freed_memory() is True
    print(default, per_allocation())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's (Linux)")
def test_reuse_freed_memory_stops_page_faults_on_large_tensors():
    run = subprocess.run([sys.executable, "-c", PAGE_FAULTS], capture_output=True, text=True, check=True)
    default, reuse = map(float, run.stdout.split()[-2:])
    pages = (64 << 20) / resource.getpagesize()
    assert default >= 0.9 * pages  # faulted in again on every allocation
    assert reuse < 0.01 * pages
