"""The in-memory plan cache of one service process (the plan store is the lasting one)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from api.store.repository import PlanRecord


class PlanCache:
    """Recently returned plans by request hash, in memory (the store is the lasting cache); also by
    the hash of the request exactly as sent, so that a repeated request needs no validation."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, PlanRecord] = OrderedDict()
        self._raw: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get_raw(self, raw: str) -> PlanRecord | None:
        with self._lock:
            key = self._raw.get(raw)
        return self.get(key) if key is not None else None

    def get(self, key: str) -> PlanRecord | None:
        with self._lock:
            rec = self._items.get(key)
            if rec is not None:
                self._items.move_to_end(key)
            return rec

    def put(self, key: str, record: PlanRecord, raw: str | None = None) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[key] = record
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            if raw is not None:
                self._raw[raw] = key
                self._raw.move_to_end(raw)
                while len(self._raw) > self.size:
                    self._raw.popitem(last=False)
