"""The Lua scripts of RedisState, and the reply decoding the scripts' callers share.

Each script is ``_value.lua`` (the lock value's prelude) followed by one or more files of this
folder; the cluster variant publishes on sharded channels. See the module docstring of
:mod:`asynclock.state.redis` for the key layout the scripts work on.
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["LuaScript", "as_int", "load_scripts", "text"]


class LuaScript:
    """Lua files of this folder joined into one script (the prelude first), run by EVALSHA.

    ``sharded``: for Redis Cluster, where the release channels are sharded channels.
    """

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str, *parts: str, sharded: bool = False) -> None:
        folder = resources.files("asynclock.state.redis")
        self.name = name
        self.text = "\n".join(
            folder.joinpath(f"{part}.lua").read_text(encoding="utf-8")
            for part in ("_value", *(parts or (name,)))
        )
        if sharded:
            # Redis Cluster: a plain PUBLISH is broadcast to every node of the cluster; a sharded
            # one stays on the node owning the channel's slot, where its waiters SSUBSCRIBE.
            self.text = self.text.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
        self.sha = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()


def load_scripts(*, sharded: bool = False) -> dict[str, LuaScript]:
    """Every script RedisState runs, by name (``sharded``: for Redis Cluster, see
    :class:`LuaScript`)."""
    names = (
        "acquire",
        "release",
        "extend",
        "inspect",
        "abandon",
        "force_release",
        "dedupe_keep",
        "forget_claim",
        "supersede",
        "supersede_carry",
        "supersede_collect",
    )
    scripts = {name: LuaScript(name, sharded=sharded) for name in names}
    scripts["claim_acquire"] = LuaScript("claim_acquire", "_claim", "acquire", sharded=sharded)
    scripts["release_claimed"] = LuaScript("release_claimed", "_settle", "release", sharded=sharded)
    # the inbox wake-up stays a PUBLISH on a cluster too (see _cluster_inbox.py): the prelude
    # that says whether the key may be added to its set of keys with work goes first
    # (and _hold.lua: what keeps a key that waits for a retry, or is parked, from a hand-out)
    scripts["inbox_accept"] = LuaScript(
        "inbox_accept", "_listed", "_handout", "_hold", "inbox_accept"
    )
    scripts["inbox_requeue"] = LuaScript(
        "inbox_requeue", "_listed", "_handout", "_hold", "inbox_requeue"
    )
    scripts["inbox_adopt"] = LuaScript("inbox_adopt", "_handout", "_hold", "inbox_adopt")
    scripts["inbox_step"] = LuaScript(
        "inbox_step", "_hold", "_inbox_step", "release", sharded=sharded
    )
    scripts["inbox_take"] = LuaScript(
        "inbox_take", "_hold", "_inbox_take", "release", sharded=sharded
    )
    scripts["inbox_ready"] = LuaScript("inbox_ready", "_hold", "inbox_ready")
    scripts["inbox_unlist"] = LuaScript("inbox_unlist")
    scripts["inbox_forget_slot"] = LuaScript("inbox_forget_slot")
    scripts["inbox_directory"] = LuaScript("inbox_directory")
    scripts["fair_acquire"] = LuaScript(
        "fair_acquire", "_fair_open", "acquire", "fair_acquire", sharded=sharded
    )
    scripts["fair_leave"] = LuaScript("fair_leave", sharded=sharded)
    # the semaphores (SemaphoreState): the _semaphore.lua prelude, then one file per operation
    for name in (
        "semaphore_acquire",
        "semaphore_release",
        "semaphore_abandon",
        "semaphore_extend",
        "semaphore_inspect",
    ):
        scripts[name] = LuaScript(name, "_semaphore", name, sharded=sharded)
    return scripts


def as_int(value: object) -> int:
    """An integer reply (RESP2 or RESP3, or a bulk string holding one)."""
    if isinstance(value, int):
        return value
    if isinstance(value, (bytes, str)):
        return int(value)
    raise TypeError(f"unexpected reply from Redis: {value!r}")


def text(value: object) -> str:
    """A string reply, decoded."""
    return value.decode() if isinstance(value, bytes) else str(value)
