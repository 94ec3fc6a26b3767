"""A bounded cache of values built once per key, for the analytic step's immutable intermediates (workloads,
priced op tables, stage memory) shared by the configs that agree on what they are built from."""
from __future__ import annotations

import threading
from typing import Callable, Hashable

_ALL: list = []  # every BoundedCache made in this process (module-level caches: made once, never dropped)


def clear_all() -> None:
    """Empty every :class:`BoundedCache` of the process: what a config seen for the first time pays (benchmarks'
    cold figures, tests that compare a warm run with a cold one)."""
    for cache in _ALL:
        cache.clear()


class BoundedCache:
    """Values built once per hashable key and kept, the oldest dropped past ``size`` entries; a key holding an
    unhashable value (a user's list in a config field) builds every time. Values must be immutable: every
    caller gets the same object."""

    def __init__(self, size: int):
        self.size = size
        self._store: dict = {}
        self._lock = threading.Lock()
        _ALL.append(self)

    def get(self, key: Hashable, build: Callable[[], object]):
        """The value of ``key``, built by ``build()`` on a miss."""
        try:
            value = self._store.get(key)
        except TypeError:
            return build()
        if value is None:
            value = build()
            with self._lock:  # a service's threads may miss together
                while len(self._store) >= self.size:
                    del self._store[next(iter(self._store))]
                self._store[key] = value
        return value

    def __contains__(self, key: Hashable) -> bool:
        try:
            return key in self._store
        except TypeError:
            return False

    def clear(self) -> None:
        with self._lock:
            self._store.clear()

    def __len__(self) -> int:
        return len(self._store)
