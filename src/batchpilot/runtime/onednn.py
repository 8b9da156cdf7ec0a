"""oneDNN's primitive cache, off unless the environment sizes it.

torch runs some CPU ops through oneDNN (GELU, convolutions, ...), which JIT-compiles one primitive per input
shape and by default caches up to 1024 of them. Batches of varying shapes (an NLP model: each new (batch size,
sequence length) pair is a new shape) keep adding primitives, allocated in the model thread between the batch's
transient tensors: live memory grows until the cache is full, the heap fragments around the cached primitives,
and the server's RSS rises for as long as new shapes arrive. textcls at 550 req/s for 150 s: the model thread's
heap grew 57 -> 125 MiB with the default cache, 63 -> 112 MiB with 128 entries (evictions churn just the same),
and stayed at 15 MiB with the cache off. The price: each call creates its primitives again (~0.2 ms per GELU).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
DEFAULT_CACHE_CAPACITY = 0


def limit_primitive_cache(environ: MutableMapping[str, str] = os.environ) -> int:
    """Turn oneDNN's primitive cache off unless `environ` sets its capacity; the capacity in force.

    oneDNN reads the setting once, when it creates its first primitive: call this before any model runs."""
    return int(environ.setdefault(CACHE_ENV, str(DEFAULT_CACHE_CAPACITY)))
