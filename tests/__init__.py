"""The asynclock test suite: conformance/ runs on every backend, unit/ needs no server."""

from __future__ import annotations
