"""``retry_on_lock_conflict`` (``decorator.py``), the retry engine the decorator and the job
wrappers share (``retrying.py``) and the in-process retry slots (``slots.py``).
"""
