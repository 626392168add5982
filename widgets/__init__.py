"""The Jupyter layer of dflash-lab: live dashboard, static (papermill) view, attach view, dashboard model.

    from widgets import TrainingView, AttachedView
    view = TrainingView(trainer); view                 # live widgets in JupyterLab, a static PNG under papermill
    trainer.train(callbacks=[view.callback])
    AttachedView("runs/big-20260101T000000Z-1a2b3c")   # follow a run written by another process

Reads dflash_lab's public API and ring buffers; dflash_lab never imports this package. Names are imported lazily,
so `widgets.model` and `widgets.overhead` work where ipywidgets / plotly are not installed (GPU servers).
"""

__all__ = ["TrainingView", "AttachedView", "DashboardModel", "DashboardState", "dashboard_mode"]


def __getattr__(name):
    if name in ("TrainingView", "AttachedView"):
        from . import views

        return getattr(views, name)
    if name in ("DashboardModel", "DashboardState"):
        from . import model

        return getattr(model, name)
    if name == "dashboard_mode":
        from .env import dashboard_mode

        return dashboard_mode
    raise AttributeError(f"module 'widgets' has no attribute {name!r}")
