"""The ``asynclock`` command line (also ``python -m asynclock``).

Subcommands:

* ``demo``: the webhook storm, without and with asynclock (see :mod:`asynclock.cli._demo`).
* ``bench``: runs the benchmark harness of a source checkout (``python -m benchmarks``).
* ``worker MODULE:ATTR``: ``serve()`` of a dispatcher until SIGTERM/SIGINT; ``inbox``: the
  durable inbox's keys, oldest ages, dead letters, retries waiting and parked keys
  (``inbox requeue KEY``, ``inbox discard KEY``).
* ``locks``: the locks held now (key, owner host and pid, seconds left, token), as a table or
  JSON; ``unlock``: force-release one key after a confirmation (``--yes`` skips it), logged.
* ``dashboard``: the web dashboard of the inbox, dead letters and locks (see
  :mod:`asynclock.cli._dashboard`; needs ``asynclock[web]``).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from asynclock._errors import StateUnavailableError
from asynclock._inbox.drainer import MAX_KEYS
from asynclock.cli._admin import format_locks, held_locks, open_state, print_locks, unlock
from asynclock.cli._demo import format_result, run_demo
from asynclock.cli._worker import dead_letter_count, inbox_command, run_worker

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from asynclock.state._protocol import LockInfo

__all__ = ("main",)

N = TypeVar("N", int, float)


def _number(
    kind: Callable[[str], N], expected: str, refusal: Callable[[str, N], str | None]
) -> Callable[[str], N]:
    """An argparse ``type``: ``kind(text)``, else "expected ``expected``"; then ``refusal``
    (the message for a value out of range, ``None`` for one in it)."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        refused = refusal(text, value)
        if refused is not None:
            raise argparse.ArgumentTypeError(refused)
        return value

    return parse


_positive_int = _number(
    int,
    "a whole number",
    lambda _, value: None if value >= 1 else f"must be at least 1, got {value}",
)
_seconds = _number(
    float,
    "seconds",
    lambda text, value: (
        None if 0 <= value < float("inf") else f"must be finite seconds >= 0, got {text}"
    ),
)
_port = _number(
    int,
    "a port number",
    lambda _, value: (
        None if 0 <= value <= 65535 else f"must be a port from 0 to 65535, got {value}"
    ),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asynclock",
        description="asyncio distributed locks and dedupe for webhook workers and bots.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="the webhook storm, without and with asynclock",
        description=(
            "Concurrent 'first message' handlers race a find-or-create of a conversation; "
            "run once without a lock and once with one AsyncLock per contact."
        ),
    )
    demo.add_argument(
        "--state",
        default="memory://",
        metavar="URL",
        help="where the locks live (default: memory://), e.g. redis://127.0.0.1:6379/0",
    )
    demo.add_argument(
        "--tasks", type=_positive_int, default=20, metavar="N", help="concurrent messages (20)"
    )
    demo.add_argument(
        "--contacts", type=_positive_int, default=5, metavar="N", help="distinct contacts (5)"
    )
    demo.add_argument(
        "--gap",
        type=_seconds,
        default=0.02,
        metavar="SECONDS",
        help="simulated database round trip between find and create (0.02)",
    )

    bench = commands.add_parser(
        "bench",
        help="the benchmark suite against peers (from a source checkout)",
        description="Runs `python -m benchmarks` of the source checkout in the current folder; "
        "every argument goes to it (try `asynclock bench --help`).",
        add_help=False,
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    for name, text in (
        ("locks", "list the locks held now (SCAN on Redis, never KEYS)"),
        ("unlock", "force-release one lock, whoever holds it (asks first)"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--state", metavar="URL", required=True, help="e.g. redis://127.0.0.1:6379/0"
        )
        sub.add_argument(
            "--prefix", metavar="PREFIX", default=None, help="the state's key prefix (asynclock:)"
        )
        if name == "locks":
            sub.add_argument("--match", metavar="GLOB", default="*", help="keys to show (*)")
            sub.add_argument("--json", action="store_true", help="JSON instead of a table")
        else:
            sub.add_argument("key", metavar="KEY")
            sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    worker = commands.add_parser(
        "worker",
        help="drain the durable inbox: serve() of the dispatcher at MODULE:ATTR",
        description="Runs serve() of the EventDispatcher at MODULE:ATTR (or of the one a "
        "function there returns) until SIGTERM/SIGINT, then finishes the entries in hand and "
        "exits 0.",
    )
    worker.add_argument("target", metavar="MODULE:ATTR", help="e.g. examples.fastapi_bot:bot")
    worker.add_argument(
        "--max-keys",
        type=int,
        default=MAX_KEYS,
        help=f"keys drained at once at most; more go to other workers (default {MAX_KEYS})",
    )
    inbox = commands.add_parser(
        "inbox",
        help="keys with pending events, the oldest age, dead letters, retries and parked keys; "
        "requeue KEY, discard KEY",
        description="Lists the durable inbox (per key: pending events, the oldest age, dead "
        "letters, and 'retrying in Ns' or 'parked'); `inbox requeue KEY` puts KEY's dead "
        "letters back at its head (a parked key goes on); `inbox discard KEY` deletes them "
        "(asks first) and the key goes on.",
    )
    inbox.add_argument(
        "action",
        nargs="*",
        metavar="requeue|discard KEY",
        help="requeue KEY's dead letters, or discard them",
    )
    inbox.add_argument("--yes", action="store_true", help="discard without asking for confirmation")
    inbox.add_argument(
        "--state", metavar="URL", required=True, help="e.g. redis://127.0.0.1:6379/0"
    )
    inbox.add_argument(
        "--prefix", metavar="PREFIX", default=None, help="the state's key prefix (asynclock:)"
    )
    _dashboard_options(
        commands.add_parser(
            "dashboard",
            help="a web page of the inbox, dead letters and locks, refreshed live",
            description="Serves the web dashboard (asynclock.web.dashboard) with uvicorn: keys "
            "with work, depth and lag, dead letters, locks held. Read-only and on 127.0.0.1 "
            "unless told otherwise. Needs `pip install 'asynclock[web]'`.",
        )
    )
    return parser


def _dashboard_options(sub: argparse.ArgumentParser) -> None:
    """The options of ``asynclock dashboard``."""
    sub.add_argument("--state", metavar="URL", required=True, help="e.g. redis://127.0.0.1:6379/0")
    sub.add_argument(
        "--prefix", metavar="PREFIX", default=None, help="the state's key prefix (asynclock:)"
    )
    sub.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)"
    )
    sub.add_argument("--port", type=_port, default=8765, help="port to listen on (8765)")
    sub.add_argument(
        "--allow-actions",
        action="store_true",
        help="offer requeue, discard and force-unlock (each confirmed in the page, logged)",
    )
    sub.add_argument(
        "--refresh",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between two refreshes of an open page (2)",
    )
    sub.add_argument(
        "--no-payloads",
        dest="payloads",
        action="store_false",
        help="never show a dead letter's payload (by default one is shown when clicked for)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``asynclock`` command line.

    Args:
        argv: the arguments after the program name; ``None`` means ``sys.argv[1:]``.

    Returns:
        The process exit code: 0 on success, 1 when the state server cannot be reached,
        2 for a usage error (and a declined ``unlock`` returns 1).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:  # everything after it belongs to the harness's own parser
        return _bench(arguments[1:])
    parser = _parser()
    args = parser.parse_args(arguments)
    command: str | None = args.command
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    if command in ("locks", "unlock"):
        return _exit_code(command, lambda: _admin_command(args))
    if command in ("worker", "inbox"):
        return _exit_code(command, lambda: _inbox_command(parser, args))
    if command == "dashboard":
        return _exit_code(command, lambda: _dashboard_command(args))
    return _exit_code(command, lambda: _demo_command(args))


def _exit_code(command: str, run: Callable[[], int]) -> int:
    """Run one command; map what it raises to the exit code and one line on stderr.

    2: a usage error (a bad URL, option or value, a missing driver); 1: the state is
    unavailable, or a question got no answer.
    """
    try:
        return run()
    except (ValueError, ImportError, NotImplementedError, TypeError) as exc:
        print(f"asynclock {command}: {exc}", file=sys.stderr)
        return 2
    except StateUnavailableError as exc:
        print(f"asynclock {command}: the state is unavailable: {exc}", file=sys.stderr)
        return 1
    except EOFError:
        print("no answer: left as it is", file=sys.stderr)
        return 1


def _demo_command(args: argparse.Namespace) -> int:
    """``demo``: the seed's scenario on the chosen state, with its summary."""
    result = asyncio.run(
        run_demo(args.state, tasks=args.tasks, contacts=args.contacts, gap=args.gap)
    )
    print(format_result(result), end="")
    return 0


def _bench(bench_args: list[str]) -> int:
    """Run ``python -m benchmarks`` of a source checkout, in a process of its own.

    The checkout is the one this package was installed from (an editable install), else the
    current folder; the harness runs with that folder as its working directory, so nothing is
    added to this process's ``sys.path``.
    """
    for checkout in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (checkout / "benchmarks" / "_cli.py").is_file():
            break
    else:
        print(
            "asynclock bench: run it from a source checkout of asynclock (the benchmarks/ "
            "folder is not part of the installed package)",
            file=sys.stderr,
        )
        return 2
    command = [sys.executable, "-m", "benchmarks", *(bench_args or ["all"])]
    return subprocess.call(command, cwd=checkout)


def _admin_command(args: argparse.Namespace) -> int:
    """``locks`` and ``unlock`` (the confirmation is asked outside the event loop)."""

    async def listing() -> int:
        async with open_state(args.state, args.prefix) as state:
            infos = await held_locks(state, args.match)
            if args.json or not infos or not print_locks(infos):
                print(format_locks(infos, as_json=args.json), end="")
        return 0

    async def holder() -> LockInfo | None:
        async with open_state(args.state, args.prefix) as state:
            return await state.inspect(args.key)

    async def release() -> int:
        async with open_state(args.state, args.prefix) as state:
            released = await unlock(state, args.key)
        if released is None:
            print(f"{args.key!r} is not held")
        else:
            print(f"released {args.key!r} (was {released.owner}, token {released.token})")
        return 0

    if args.command == "locks":
        return asyncio.run(listing())
    if not args.yes:
        held = asyncio.run(holder())
        if held is None:
            print(f"{args.key!r} is not held")
            return 0
        answer = input(
            f"force-release {args.key!r} held by {held.owner} ({held.remaining:.1f} s left)? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("left as it is")
            return 1
    return asyncio.run(release())


def _dashboard_command(args: argparse.Namespace) -> int:
    """``dashboard``: serve the web page until SIGINT/SIGTERM."""
    from asynclock.cli._dashboard import serve_dashboard

    return asyncio.run(
        serve_dashboard(
            args.state,
            args.prefix,
            host=args.host,
            port=args.port,
            allow_actions=args.allow_actions,
            refresh=args.refresh,
            payloads=args.payloads,
        )
    )


def _inbox_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``worker`` and ``inbox``."""
    if args.command == "worker":
        return asyncio.run(run_worker(args.target, max_keys=args.max_keys))
    action: list[str] = args.action
    if action and (action[0] not in ("requeue", "discard") or len(action) != 2):
        parser.error(
            f"inbox takes no argument, `requeue KEY` or `discard KEY`, got {' '.join(action)!r}"
        )
    verb, key = (action[0], action[1]) if action else (None, None)
    if verb == "discard" and not args.yes:
        assert key is not None
        # asked outside the event loop, as unlock asks: deleting dead letters cannot be undone
        dead = asyncio.run(dead_letter_count(args.state, args.prefix, key))
        if not dead:
            print(f"{key!r} has no dead letters")
            return 0
        answer = input(f"delete the {dead} dead letter(s) of {key!r} for good? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("left as it is")
            return 1
    print(asyncio.run(inbox_command(args.state, args.prefix, verb, key)), end="")
    return 0
