"""Builders and comparisons shared by the test modules (test files import from here, never from each other)."""
