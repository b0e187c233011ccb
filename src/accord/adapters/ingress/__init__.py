"""HTTP ingress: the control-plane API (``accord serve``) and its signed callbacks.

:func:`accord.adapters.ingress.app.create_app` builds the FastAPI application. Its modules import
FastAPI, so nothing outside this package imports them at module level.
"""
