"""Tests that need no server."""

from __future__ import annotations
