"""All Qt: main window, workflow pages, 3D scene view, plots, job runner.

- `app.run_gui` starts the app; `main_window.MainWindow` holds the pages and docks.
- Pages follow the contract in `pages.py` (`Page(controller, parent=None)`, empty state,
  `python -m widgets.<page>` preview, long work through `controller.submit_job`).
- Shared widgets: `scene_view.SceneView` (meshes, points, frames), `trajectory_plot.
  TrajectoryPlot` (named series, linked x, time cursor), `jobs.JobRunner` (the one worker pool).
- Widgets act only through app/ (`app.controller.AppController`, `app.workflows`) and read core
  value types to draw them.
"""
