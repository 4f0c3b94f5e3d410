"""Calibrate page (workflow step: calibrate). Shows its empty state until the step's tools are built.

See widgets/pages.py for the page contract.
"""

from __future__ import annotations

from widgets.pages import WorkflowPage, preview


class CalibratePage(WorkflowPage):
    """Workflow page for the 'calibrate' step; constructed as `CalibratePage(controller, parent=None)`."""

    step = "calibrate"


if __name__ == "__main__":
    raise SystemExit(preview(CalibratePage))
