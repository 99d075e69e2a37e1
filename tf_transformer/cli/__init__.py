"""Thin command-line entry points over importable functions."""
