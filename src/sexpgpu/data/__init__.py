"""Where microbatches come from: record files, the built-in pydoc corpus, and generators.

A data source is a pure function of the global record index, so the data position of a run
is its step and nothing else needs saving to resume it.
"""
