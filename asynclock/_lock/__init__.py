"""``AsyncLock`` and its parts: the public lock (``lock.py``), the face of its engine
``Acquisition`` (``acquisition.py``: acquiring; its base ``Hold`` in ``holding.py``: holding and
releasing; ``Place`` in ``place.py``: the dispatcher's place in line), the per-key line of
waiters of one process (``waiters.py``), auto-renewal (``renew.py``), release on exit
(``leave.py``, shared with the semaphore) and the two ambient contexts the lock reads: the grant
of ``process_without_lock`` (``grant.py``) and the fair turn of a retried call (``turn.py``).
"""
