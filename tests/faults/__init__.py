"""Fault tests: each case records tried / held / lost in the fault table (conftest.py)."""
