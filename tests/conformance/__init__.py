"""Behaviour every state backend must show; each test runs once per backend in _matrix.STATES."""

from __future__ import annotations
