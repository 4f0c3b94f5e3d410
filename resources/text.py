"""Small text helpers for messages people read."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 frame', '2 frames', '0 frames'; `plural` for irregular nouns ('1 child')."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
