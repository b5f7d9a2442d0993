"""Exercise checks of lesson 08 (each one prints a single line and returns True or False)."""

from __future__ import annotations

__all__: list[str] = []
