"""The key a taskiq message names in a label, for the middlewares that lock or reserve it.

A label holds either the key itself (``.with_labels(lock_key="invoice:42")`` at ``kiq`` time) or
a template formatted with the task's arguments by name (``@broker.task(lock_key="invoice:{id}")``,
``str.format_map`` over the bound arguments), so one declaration covers every call.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from asynclock._validate import check_key

if TYPE_CHECKING:
    from taskiq import AsyncBroker, TaskiqMessage

__all__ = ("message_key",)


def message_key(message: TaskiqMessage, label: str, broker: AsyncBroker) -> str | None:
    """The key ``message``'s ``label`` names, its template filled in; ``None`` without one.

    Raises:
        ValueError: the template names an argument the call does not have, or the task is not
            registered with ``broker`` in this process (its arguments cannot be named).
        TypeError: the arguments do not fit the task's signature.
    """
    value = message.labels.get(label)
    if value is None or value == "":
        return None
    text = str(value)
    if "{" not in text:
        return check_key(text, f"label {label!r}")
    task = broker.find_task(message.task_name)
    if task is None:
        raise ValueError(
            f"label {label}={text!r} of task {message.task_name!r} is a template, and the task "
            "is not registered with this broker here: import the module that declares it, or "
            "give the key itself at kiq time (.with_labels(...))"
        )
    try:
        bound = inspect.signature(task.original_func).bind_partial(*message.args, **message.kwargs)
    except TypeError as error:
        raise TypeError(
            f"the arguments of task {message.task_name!r} do not fit its signature, so its "
            f"label {label}={text!r} cannot be filled in: {error}"
        ) from error
    try:
        key = text.format_map(bound.arguments)
    except (KeyError, IndexError, AttributeError) as error:
        raise ValueError(
            f"label {label}={text!r} of task {message.task_name!r} names {error}, which the "
            f"call does not have (its arguments: {', '.join(bound.arguments) or 'none'})"
        ) from error
    return check_key(key, f"label {label!r}")
