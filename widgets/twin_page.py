"""Twin page (workflow step: twin). Shows its empty state until the step's tools are built.

See widgets/pages.py for the page contract.
"""

from __future__ import annotations

from widgets.pages import WorkflowPage, preview


class TwinPage(WorkflowPage):
    """Workflow page for the 'twin' step; constructed as `TwinPage(controller, parent=None)`."""

    step = "twin"


if __name__ == "__main__":
    raise SystemExit(preview(TwinPage))
