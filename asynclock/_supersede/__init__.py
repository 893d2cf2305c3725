"""``on_lock_conflict="supersede"``: the per-key line of ``dispatch``/``deliver``/``submit``
(``line.py``) and the durable inbox's superseding drain (``inbox.py``).
"""
