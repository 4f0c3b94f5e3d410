"""All Qt: main window, workflow pages, 3D scene view, plots, job runner."""
