"""``supersede`` across two OS processes sharing one server (SPEC section 10).

The holder's handler streams in another process; the newer event's process interrupts it through
the server's push (Redis pub/sub, PostgreSQL NOTIFY, MySQL's ear killed by KILL QUERY). The flag
must reach the holder well within the waiter's one-second wait slice, which a poll would not.
"""

from __future__ import annotations

import multiprocessing
from typing import TYPE_CHECKING

import pytest

from tests import _supersede_workers
from tests.conformance.test_processes import run_processes

if TYPE_CHECKING:
    from tests.conftest import Target

pytestmark = pytest.mark.processes

#: seconds from the newer event's dispatch to the flag in the holder's process (loaded box)
PROMPT = 0.8


@pytest.mark.parametrize("grace", [0.0, 0.3, None])
async def test_a_newer_event_interrupts_a_handler_in_another_process(
    server_target: Target, grace: float | None
) -> None:
    inside = multiprocessing.get_context("spawn").Event()
    roles = ("holder", "newer")
    reports = await run_processes(
        _supersede_workers.supersede_worker,
        lambda n: (server_target.url, server_target.options, roles[n], grace, inside),
        2,
    )
    holder, newer = sorted(reports, key=lambda report: roles.index(report["role"]))
    assert holder["outcome"] == "superseded"
    assert newer["outcome"] == "queued"
    assert holder["flagged"] - newer["sent"] < PROMPT
    if grace is None:
        assert holder["ended"] == "returned"  # never cancelled: it streamed to its end
    else:
        assert holder["ended"] == "cancelled"
        waited = holder["ended_at"] - holder["flagged"]
        assert grace - 0.02 <= waited < grace + PROMPT
    assert newer["began"] >= holder["ended_at"]  # the newer call starts once the older ended
    assert newer["token"] > holder["token"]
