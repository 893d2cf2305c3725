"""The dispatcher's value types and what every route shares about events: the types
(``event.py``), the handler table (``handlers.py``), the JSON form the state stores
(``codec.py``) and the folding of a burst into one call (``folding.py``).
"""
