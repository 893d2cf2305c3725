"""``EventDispatcher`` (``dispatcher.py``, with the outcome record every event ends in) and the
parts only it uses: the ``Route`` interface (``route.py``) with the general route
(``general_route.py``) and the in-memory fast route (``fast_route.py``, its hold of a key in
``lean_hold.py``), the settings they share (``context.py``), the conflict policies
(``policies.py``), the latest/debounce backlogs (``backlog.py``), done-mark retries
(``done_marks.py``), webhook answers (``delivery.py``) and the Retry-After estimate
(``freeing.py``).
"""
