"""Adapters for the frameworks where bots and jobs live: one module per framework, each importing its framework lazily (a missing framework names its extra in the ImportError)."""
