"""``EventDispatcher`` (``dispatcher.py``) and the parts only it uses: webhook answers
(``delivery.py``), the Retry-After estimate (``freeing.py``) and the in-memory fast route
(``fast_route.py``).
"""
