"""oneDNN's primitive cache stays off in the runtime: torch ops fed ever new shapes keep no memory."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from batchpilot.runtime.onednn import CACHE_ENV, limit_primitive_cache

# In a fresh process (oneDNN reads its capacity once): GELU, which torch runs through oneDNN on the CPU, on 400
# shapes of [batch, length, 512], as an NLP model's batches come; prints the growth of glibc's live heap bytes.
GROWTH_SCRIPT = """
import ctypes, sys
import torch
from batchpilot.runtime.onednn import limit_primitive_cache
if sys.argv[1] == "limited":
    limit_primitive_cache()

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
torch.set_num_threads(1)
torch.nn.functional.gelu(torch.ones(2, 8, 512))
before = libc.mallinfo2().uordblks
for batch in range(1, 21):
    for length in range(8, 28):
        torch.nn.functional.gelu(torch.ones(batch, length, 512))
print(libc.mallinfo2().uordblks - before)
"""


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


def test_the_cache_is_off_unless_the_environment_sizes_it() -> None:
    environ: dict[str, str] = {}
    assert limit_primitive_cache(environ) == 0
    assert environ == {CACHE_ENV: "0"}
    assert limit_primitive_cache({CACHE_ENV: "256"}) == 256


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc's mallinfo2")
def test_new_shapes_keep_no_memory_with_the_cache_off() -> None:
    def growth_mib(mode: str) -> float:
        env = {k: v for k, v in os.environ.items() if k != CACHE_ENV}
        out = subprocess.run(
            [sys.executable, "-c", GROWTH_SCRIPT, mode], env=env, capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[-1]) / 2**20

    default, limited = growth_mib("default"), growth_mib("limited")
    assert default > 2.0, f"oneDNN's default cache kept only {default:.2f} MiB for 400 shapes: the test shows nothing"
    assert limited < 0.5, f"{limited:.2f} MiB kept with the cache off"
