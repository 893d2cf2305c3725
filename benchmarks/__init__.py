"""Benchmarks of asynclock against its peers (redis-py's Lock, python-redis-lock, asyncio.Lock).

Run ``python -m benchmarks --help``. Results go to stdout as markdown and, with ``--write``,
into ``docs/benchmarks.md``. Nothing here is part of the installed package.
"""

from __future__ import annotations

__all__ = ()
