"""``on_lock_conflict="supersede"``: the dispatcher's route (``route.py``), the per-key line of
``dispatch``/``deliver``/``submit`` (``line.py``) and the durable inbox's superseding drain
(``inbox.py``).
"""
