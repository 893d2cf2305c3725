"""The dispatcher's handler table: handlers per event type, and how a call reaches them."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Generator
from types import CoroutineType
from typing import cast

from asynclock._events.event import Event, HandlerContext
from asynclock._validate import check_key

#: ``(event)`` or ``(event, ctx)``; a coroutine function, or a plain function (its result is
#: awaited when it is awaitable)
Handler = Callable[[Event], object] | Callable[[Event, HandlerContext], object]


class Registered:
    """A handler and whether it takes ``(event, ctx)``."""

    __slots__ = ("one", "two")

    def __init__(self, function: Handler) -> None:
        self.one: Callable[[Event], object] | None = None
        self.two: Callable[[Event, HandlerContext], object] | None = None
        if _positional_count(function) >= 2:
            self.two = cast("Callable[[Event, HandlerContext], object]", function)
        else:
            self.one = cast("Callable[[Event], object]", function)

    async def __call__(self, event: Event, ctx: HandlerContext) -> None:
        result = self.start(event, ctx)
        if inspect.isawaitable(result):
            await result

    def start(self, event: Event, ctx: HandlerContext) -> object:
        """Call the handler; what it returns (a coroutine, for an ``async def``) is to be awaited
        when it is awaitable."""
        if self.two is not None:
            return self.two(event, ctx)
        assert self.one is not None
        return self.one(event)


class HandlerTable:
    """Handlers by event type (``"*"``: every type), in registration order."""

    __slots__ = ("_by_type", "_resolved", "_with_context")

    def __init__(self) -> None:
        self._by_type: dict[str, list[Registered]] = {}
        #: for_type's answers, made once per event type until the next registration
        self._resolved: dict[str, list[Registered]] = {}
        #: per event type: whether one of its handlers takes ``(event, ctx)``
        self._with_context: dict[str, bool] = {}

    def add(self, event_type: str, handler: Handler) -> None:
        """Register ``handler`` for ``event_type``."""
        check_key(event_type, "event_type")
        if not callable(handler):
            raise TypeError(f"a handler must be callable, got {handler!r}")
        self._by_type.setdefault(event_type, []).append(Registered(handler))
        self._resolved.clear()
        self._with_context.clear()

    def for_type(self, event_type: str) -> list[Registered]:
        """The handlers of ``event_type``: its own, then the catch-alls (shared: never mutate)."""
        resolved = self._resolved.get(event_type)
        if resolved is None:
            resolved = self._resolved[event_type] = self._resolve(event_type)
        return resolved

    def with_context(self, event_type: str) -> tuple[list[Registered], bool]:
        """:meth:`for_type`, and whether one of them takes ``(event, ctx)`` (else no context
        need be made for the call)."""
        wanted = self._with_context.get(event_type)
        handlers = self.for_type(event_type)
        if wanted is None:
            wanted = self._with_context[event_type] = any(h.two is not None for h in handlers)
        return handlers, wanted

    def _resolve(self, event_type: str) -> list[Registered]:
        if event_type == "*":  # an event whose type is literally "*": the catch-alls, once
            return [*self._by_type.get("*", ())]
        return [*self._by_type.get(event_type, ()), *self._by_type.get("*", ())]

    def route_of(self, event_type: str) -> str | None:
        """Who serves ``event_type`` in a batch: its own type, ``"*"``, or nobody (``None``)."""
        if event_type != "*" and self._by_type.get(event_type):
            return event_type
        return "*" if self._by_type.get("*") else None


async def call_all(handlers: list[Registered], event: Event, ctx: HandlerContext) -> None:
    """Run ``handlers`` one after the other (a failure stops the rest)."""
    for handler in handlers:
        # the handler's coroutine is awaited here rather than inside Registered.__call__: one
        # frame less between the loop and the handler, at every resumption
        result = handler.start(event, ctx)
        if type(result) is CoroutineType or inspect.isawaitable(result):
            await result


def _positional_count(function: Handler) -> int:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return 1
    count = 0
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            return 2
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


@types.coroutine
def resume(
    coro: CoroutineType[object, object, object], yielded: object
) -> Generator[object, object, None]:
    """The rest of ``await coro`` once its first step (``coro.send(None)``, by the caller) has
    yielded ``yielded``: what ``yield from`` does, from there on.

    The dispatcher's lean path starts a handler's coroutine itself to learn whether it
    suspends: if it does, that suspension is the dispatch's yield (the yield rule), so no
    extra loop pass is spent on one of its own.
    """
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:  # noqa: PERF203 - the loop is `yield from`'s: one try per resumption
            coro.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - thrown in (a cancellation): passed on
            try:
                yielded = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration:
                return
