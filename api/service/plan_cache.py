"""The in-memory plan cache of one service process (the plan store is the lasting one), and the solves
in flight, which identical requests share."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

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


@dataclass
class Flight:
    """One solve in progress for a normalised request: the plan id every request that shares it answers with,
    the pending record stored under that id (a plan-ahead request leads or joined it; None while none is), and
    the finished record (or the error) when it ends."""

    plan_id: str
    pending: PlanRecord | None = None
    done: Future[PlanRecord] = field(default_factory=Future)


class InFlight:
    """Solves in progress by request hash, so that identical requests share one solve and one plan."""

    def __init__(self) -> None:
        self._items: dict[str, Flight] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Flight | None:
        with self._lock:
            return self._items.get(key)

    def claim(self, key: str, plan_id: str) -> tuple[Flight, bool]:
        """The flight for ``key`` and whether the caller leads it (and must :meth:`land` it)."""
        with self._lock:
            flight = self._items.get(key)
            if flight is not None:
                return flight, False
            flight = self._items[key] = Flight(plan_id)
            return flight, True

    def land(
        self, key: str, flight: Flight, record: PlanRecord | None = None, error: BaseException | None = None
    ) -> None:
        """End the leader's flight with its record or its error; later requests start a new one."""
        with self._lock:
            if self._items.get(key) is flight:
                del self._items[key]
        if flight.done.done():
            return
        if error is not None:
            flight.done.set_exception(error)
        else:
            flight.done.set_result(record)  # type: ignore[arg-type]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
