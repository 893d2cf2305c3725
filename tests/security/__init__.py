"""Security tests (issue #7): owner ids, prefixes, Redis ACL and TLS, redaction, SQL keys."""
