"""Scan page (workflow step: scan). Shows its empty state until the step's tools are built.

See widgets/pages.py for the page contract.
"""

from __future__ import annotations

from widgets.pages import WorkflowPage, preview


class ScanPage(WorkflowPage):
    """Workflow page for the 'scan' step; constructed as `ScanPage(controller, parent=None)`."""

    step = "scan"


if __name__ == "__main__":
    raise SystemExit(preview(ScanPage))
