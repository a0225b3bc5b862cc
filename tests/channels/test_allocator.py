"""keep_freed_memory: large frames reuse the pages freed before them (a process setting,
so each case runs in a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from channels import keep_freed_memory
from pump import ConfigError

#: Frames of 300 KiB made and dropped four at a time, as a link's reads make them; the
#: page faults of a second round are counted (the first warms the heap).
_CHURN = textwrap.dedent("""
    import json, resource, sys
    from channels import keep_freed_memory
    applied = keep_freed_memory() if sys.argv[1] == "keep" else None
    def churn():
        for _ in range(200):
            frames = [b"x" * (300 << 10) for _ in range(4)]
            del frames
    churn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"applied": applied, "faults": faults}))
""")


def _churn(mode: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True,
                          text=True, timeout=60, env={**environ, **env}, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_freed_frames_are_reused_instead_of_faulted_in_again() -> None:
    plain, kept = _churn("plain"), _churn("keep")
    if not kept["applied"]:
        pytest.skip("this C library has no such setting")
    assert isinstance(plain["faults"], int) and isinstance(kept["faults"], int)
    # glibc's defaults: a page fault every 4 KiB of every frame (800 frames of 300 KiB)
    assert plain["faults"] > 20_000
    assert kept["faults"] < plain["faults"] // 20


def test_an_allocator_setting_in_the_environment_is_left_as_it_is() -> None:
    kept = _churn("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert kept["applied"] is False
    assert _churn("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")["applied"] is False


def test_sizes_are_checked() -> None:
    with pytest.raises(ConfigError, match="0 bytes or more"):
        keep_freed_memory(keep=-1)
