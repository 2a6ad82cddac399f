"""The package's version, in a module of its own: the stages that print it import it from
here, so that the package's `__init__`, which re-exports the Python API (api.py), is imported
by none of them."""

__version__ = "0.1.0"
