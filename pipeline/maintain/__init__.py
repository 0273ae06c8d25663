"""Commands on a finished build: remove, retry, append (docs/maintenance.md)."""
