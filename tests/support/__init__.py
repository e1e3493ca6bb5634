"""Test support shared across the suite (real servers, helpers)."""
