"""docs/custom-backends.md's checklist names every method of every capability, and no other.

The checklist is what a new backend's author works through: a method missing from it is one the
author learns of only when the conformance suite fails (``inbox_discard`` was, for a while).
Each row is held against the protocol it names: the methods the protocol defines, and for a
method that yields another protocol (``inbox_worker (an InboxWorker: next, take)``) that one's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import asynclock.state as state_module
from asynclock.state._backends import CAPABILITIES

DOC = Path(__file__).parents[2] / "docs" / "custom-backends.md"
ROW = re.compile(r"^\| `(\w+)` \| (.+?) \| .+ \|$")
NESTED = re.compile(r"\(an? `(\w+)`: ([^)]*)\)")
NAME = re.compile(r"`(\w+)`")


def checklist() -> dict[str, str]:
    """The table's rows: capability name -> its methods cell."""
    rows = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def methods(protocol: type) -> set[str]:
    """The public methods ``protocol`` itself defines."""
    return {name for name, value in vars(protocol).items() if callable(value) and name[0] != "_"}


@pytest.mark.parametrize("capability", ["State", *CAPABILITIES])
def test_the_checklist_row_names_the_protocols_methods(capability: str) -> None:
    rows = checklist()
    assert capability in rows, f"docs/custom-backends.md has no row for {capability}"
    cell = rows[capability]
    for nested, names in NESTED.findall(cell):
        protocol = getattr(state_module, nested)
        assert set(NAME.findall(names)) == methods(protocol), f"{capability}: {nested}"
    listed = set(NAME.findall(NESTED.sub("", cell)))
    assert listed == methods(getattr(state_module, capability)), capability
