"""``Deduper`` (``deduper.py``) and the dispatcher's two-phase event claims (``claim.py``)."""
