"""``python -m asynclock``: the command line (the ``asynclock`` script calls ``main`` here too)."""

from __future__ import annotations

from asynclock.cli import main

__all__ = ("main",)

if __name__ == "__main__":
    raise SystemExit(main())
