"""The durable inbox: the dispatcher's ``accept()`` and ``serve()`` (``service.py``), the worker
loop and one-entry drain (``drainer.py``), the batches of ``latest``/``debounce`` (``fold.py``)
and retries that wait (``retry.py``).
"""
