"""Thin HTTP routes: parse, call the planning service or the store, answer."""
