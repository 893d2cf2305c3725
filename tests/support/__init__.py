"""What several test packages share to run things outside the test's own event loop.

* ``ports``: a free loopback port, or a socket already bound to one.
* ``processes``: the OS-process harness: spawned workers behind a start line and their reports,
  one spawned process killed on purpose, process groups stopped or killed.
* ``reporting``: the one line of figures a test prints (``pytest -s`` shows it).
* ``servers``: throwaway ``redis-server`` processes (faults, Sentinel, security) and the
  skip-locally, fail-in-CI check for the programs they need.
* ``storm``: the test side of the webhook storm (the demo's half ships in ``asynclock.cli``).
"""

from __future__ import annotations
