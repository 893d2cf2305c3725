"""The ``asynclock`` command line and its demos (also ``python -m asynclock``).

* ``_main``: argument parsing and the subcommands (``demo``, ``bench``, ``locks``, ``unlock``).
* ``_admin``: ``locks`` / ``unlock`` over any state that has the ``LockAdmin`` capability.
* ``_demo`` and ``_demo_dispatch``: the webhook storm without and with asynclock, and the
  dispatcher's policies side by side.
* ``_storm``: the storm itself (find-or-create under concurrent first messages), what the demo
  runs; the tests run it too, and keep what only they need in ``tests/support/``.

Nothing in the library imports this package: it sits on top of the public API.
"""

from __future__ import annotations

from asynclock.cli._main import main

__all__ = ("main",)
