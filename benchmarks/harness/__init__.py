"""The one benchmark harness: command line, rounds, report, results, servers, the ``Variant``."""
