"""Fixtures shared by unit tests (the one-rank process group lives in tests/conftest.py)."""
