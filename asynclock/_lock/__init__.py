"""``AsyncLock`` and its parts: the public lock (``lock.py``) and its engine, split by concern:
``engine.py`` (the uncontended path: this process's line of each key, a place in it, one try,
holding, the release and its hand-over to the next waiter, release on exit, shared with the
semaphore), ``acquisition.py`` (``Acquisition``, the engine's class: waiting in line and
contending, which only a busy key runs), auto-renewal (``renew.py``, made when the first
renewal is due) and the two ambient contexts the lock reads: the grant of
``process_without_lock`` (``grant.py``) and the fair turn of a retried call (``turn.py``).
"""
