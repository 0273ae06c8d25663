"""Shared foundations: formats, storage, config reading, map-reduce; imports no other part."""
