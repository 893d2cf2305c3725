"""Optional helpers for state classes: shared behaviour, never part of the State contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self


class ClosesOnExit:
    """Mixin: ``async with state:`` returns the state and awaits its ``aclose()`` on exit (the
    states, and the ``EventDispatcher``)."""

    __slots__ = ()

    async def aclose(self) -> None:
        """Release the resources (each class defines it)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
