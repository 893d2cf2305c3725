"""The durable inbox's drain: the worker loop and one-entry drain (``drainer.py``), the
batches of ``latest``/``debounce`` (``fold.py``) and retries that wait (``retry.py``).
"""
