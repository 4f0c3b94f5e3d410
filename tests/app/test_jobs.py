"""The CLI's terminal driver of jobs (app/jobs.py)."""

from __future__ import annotations

import io

from app.jobs import TerminalProgress
from resources.jobs import Progress


def test_terminal_progress_plain_output() -> None:
    buf = io.StringIO()
    bar = TerminalProgress(buf)
    bar(Progress(0.5, "integrating"))
    bar(Progress(None, "extracting mesh"))
    out = buf.getvalue()
    assert " 50.0% integrating" in out and "extracting mesh" in out
