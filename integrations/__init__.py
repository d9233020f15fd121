"""Instrumentors, one module per framework (``agl_bridge.integrations``).

Each module imports its framework lazily, so importing this package costs nothing.
"""
