"""The example web apps (examples/) driven over real HTTP on loopback, against a real server."""

from __future__ import annotations
