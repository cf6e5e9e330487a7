"""A bounded mapping, the least recently used entry dropped first: for what a runner or an adapter keeps per input
shape or per instruction, which a stream of new inputs would otherwise grow without end."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Iterator, Optional


class LruCache:
    """At most ``max_items`` entries; ``on_evict(key, value)`` is told of each one dropped (a runner frees its
    graphs there)."""

    def __init__(self, max_items: int, on_evict: Optional[Callable[[Hashable, object], None]] = None):
        self.max_items = max(1, int(max_items))
        self.on_evict = on_evict
        self._items: "OrderedDict[Hashable, object]" = OrderedDict()   # least recently used first

    def get(self, key: Hashable):
        """The value of ``key`` (now the most recently used), or None."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value) -> None:
        """Keep ``value`` under ``key``, first dropping the least recently used entries beyond the bound."""
        while len(self._items) >= self.max_items:
            self.evict(next(iter(self._items)))
        self._items[key] = value

    def get_or_make(self, key: Hashable, make: Callable[[], object]):
        """The value of ``key``, made by ``make()`` and kept when missing."""
        value = self.get(key)
        if value is None:
            value = make()
            self.put(key, value)
        return value

    def evict(self, key: Hashable) -> None:
        value = self._items.pop(key)
        if self.on_evict is not None:
            self.on_evict(key, value)

    def keys(self) -> list:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._items))


__all__ = ["LruCache"]
