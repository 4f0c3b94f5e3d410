"""Policies page (workflow step: policies). Shows its empty state until the step's tools are built.

See widgets/pages.py for the page contract.
"""

from __future__ import annotations

from widgets.pages import WorkflowPage, preview


class PoliciesPage(WorkflowPage):
    """Workflow page for the 'policies' step; constructed as `PoliciesPage(controller, parent=None)`."""

    step = "policies"


if __name__ == "__main__":
    raise SystemExit(preview(PoliciesPage))
