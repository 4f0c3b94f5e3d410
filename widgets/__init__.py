"""All Qt: main window, workflow pages, 3D scene view, plots, job runner.

- `app.run_gui` starts the app; `main_window.MainWindow` holds the pages and docks.
- Pages follow the contract in `pages.py` (`Page(controller, parent=None)`, empty state,
  `python -m widgets.<page>` preview, long work through `controller.submit_job`).
- Shared widgets: `scene_view.SceneView` (meshes, points, frames), `trajectory_plot.
  TrajectoryPlot` (named series, linked x, time cursor), `jobs.JobRunner` (the one worker pool).
- Widgets act only through app/ (`app.session.AppController`, `app.workflows`) and read core
  value types to draw them.
"""

import sys

from PySide6 import QtCore as _QtCore  # noqa: F401  (installs PySide's import hook, patched below)


def _skip_pyside_source_scan() -> None:
    """Stop PySide6 reading the source of every module imported after it.

    PySide6 replaces `__import__` to support `from __feature__ import snake_case`; after each
    import it reads the new module's whole source (`inspect.getsource`) to look for the text
    "PySide6". That is ~0.3 ms of GIL-held Python per module: 0.8 s of the 2.5 s it takes to
    import the fit's and deploy's modules, paid in the window's thread by every lazy import
    and competing with it from every job thread (a 122 ms event-loop stall in `bench loop`'s
    deploy step was this scan). No module here selects a feature, so every module is what the
    hook calls "ignored" (-1) — as pyqtgraph's already are, since their source never names
    PySide6 — and the answer can be given without reading anything.
    """
    feature = sys.modules.get("shibokensupport.feature")
    if feature is not None and hasattr(feature, "_mod_uses_pyside"):
        setattr(feature, "_mod_uses_pyside", lambda module: False)  # noqa: B010  (a module attr)


_skip_pyside_source_scan()
