"""The experiment language: text -> syntax (reader) -> checked forms (forms).

The language knows nothing of graphs' execution or of backends: it produces an
`Experiment` that the graph stage compiles.
"""
