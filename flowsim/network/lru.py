"""A least-recently-used mapping bounded by the bytes of its values (the flow engine's caches of prepared
collectives, routes and symmetry quotients), safe to share between threads."""
from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["BytesLRU"]


class BytesLRU:
    """Least-recently-used mapping bounded by the bytes its values declare (``put``), oldest dropped first; the
    newest entry is kept even when it alone passes the bound. Each call holds a lock (the flow engine's threads,
    :mod:`flowsim.network.parallel`, share these caches).

    Parameters
    ----------
    max_bytes : int
        Bound on the sum of the declared sizes, bytes.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes, self.items = max_bytes, 0, OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, default=None):
        """The value stored under ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            hit = self.items.get(key)
            if hit is None:
                return default
            self.items.move_to_end(key)
            return hit[0]

    def put(self, key, value, nbytes: int) -> None:
        """Store ``value`` (declared ``nbytes`` bytes) under ``key``, dropping the oldest entries past the bound."""
        with self._lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self.items[key] = (value, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes and len(self.items) > 1:
                self.bytes -= self.items.popitem(last=False)[1][1]

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self.items.clear()
            self.bytes = 0
