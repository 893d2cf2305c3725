"""The Semaphore primitive: N holders per key (``semaphore.py``), how a permit is taken in turn
(``contend.py``) and the state capability it needs (``capability.py``)."""

from __future__ import annotations

from asynclock._semaphore.semaphore import Semaphore

__all__ = ["Semaphore"]
