"""Streaming row updates into the live store."""
