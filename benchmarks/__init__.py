"""Benchmarks of asynclock against its peers (redis-py's Lock, python-redis-lock, asyncio.Lock...).

Run ``python -m benchmarks --help``. Results go to stdout as markdown and, with ``--write``,
into ``docs/benchmarks.md`` and ``benchmarks/summary/``. Nothing here is part of the installed
package.

* ``harness/``: the one harness (command line, rounds, report, results, servers, ``Variant``);
* ``scenarios/``: one module per scenario (``_name.py`` parts beside the one that needs them),
  each importing only the harness;
* ``views/``: the targets table and the plots, drawn from what the scenarios stored;
* ``_cli.py``: which scenarios there are, in the doc's order.
"""

from __future__ import annotations

__all__ = ()
