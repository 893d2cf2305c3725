"""The test side of the webhook storm of issue #3.

The storm itself (messages, handlers, the tally) is ``asynclock.cli._storm``, which the
``asynclock demo`` command runs; what only the tests need lives here. The cross-process workers
and their Redis-backed database are ``tests/_storm_workers.py``.
"""

from __future__ import annotations

import random

from asynclock.cli._storm import Message


def storm_messages(contacts: int, per_contact: int, seed: int | None = None) -> list[Message]:
    """``contacts * per_contact`` messages, shuffled (ids ``0..n-1``, contact ``id % contacts``)."""
    messages = [Message(n, n % contacts) for n in range(contacts * per_contact)]
    random.Random(seed).shuffle(messages)
    return messages
