"""Example web apps embedding asynclock's EventDispatcher (see examples/README.md)."""

from __future__ import annotations
