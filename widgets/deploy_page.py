"""Deploy page (workflow step: deploy). Shows its empty state until the step's tools are built.

See widgets/pages.py for the page contract.
"""

from __future__ import annotations

from widgets.pages import WorkflowPage, preview


class DeployPage(WorkflowPage):
    """Workflow page for the 'deploy' step; constructed as `DeployPage(controller, parent=None)`."""

    step = "deploy"


if __name__ == "__main__":
    raise SystemExit(preview(DeployPage))
