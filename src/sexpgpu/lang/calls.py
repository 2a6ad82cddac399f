"""Calls of defined graphs from a defrun: `(mlp x :hidden 32)`, `(generator teacher :width 8)`.

A call names a definition of the right kind, passes record fields (symbols) for its inputs,
and sets its options; options not given take the definition's defaults, so a `Call` carries
every option of its graph.
"""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.experiment import Call
from sexpgpu.lang.keywords import Key, first_keyword, read_keys
from sexpgpu.lang.syntax import SList, Symbol
from sexpgpu.lang.values import like, type_error


def read_call(form: SList, head, items, graphs: dict, kind: str, label: str, *, inputs_taken: int = 0,
              builtins: tuple = ()) -> Call:
    """`(HEAD FIELD ... :OPTION VALUE ...)` where HEAD names a `kind` definition in `graphs`.

    `inputs_taken` inputs of the graph are supplied by the caller (a loss graph's first input
    is the model's output); the rest are record fields.
    """
    graph = _definition(head, graphs, kind, label, builtins)
    where = f"({head.name} ...)"
    wanted = len(graph.inputs) - inputs_taken
    if wanted < 0:
        raise SexpgpuError(
            "E-FORM-009",
            f"{label} passes the model's output as the first input of {kind} '{head.name}', which has no inputs.",
            head.loc,
        )
    fields = read_fields(form, items, where, wanted, _input_words(graph, inputs_taken))
    table = {name: Key(like(default), default) for name, default in graph.options.items()}
    options = read_keys(items[len(fields):], table, where, form)
    return Call(head.name, tuple(f.name for f in fields), options, form.loc, tuple(f.loc for f in fields))


def read_fields(form: SList, items, where: str, count: int, names: str = "") -> list:
    """The positional record-field symbols at the start of `items`, exactly `count` of them."""
    given = items[: first_keyword(items)]
    if len(given) != count:
        place = given[count].loc if len(given) > count else form.loc
        listed = f" ({names})" if names else ""
        raise SexpgpuError(
            "E-FORM-009",
            f"{where} takes {count} record field{'s' if count != 1 else ''}{listed}, found {len(given)}.",
            place,
        )
    for item in given:
        if not isinstance(item, Symbol):
            raise type_error("a symbol naming a record field", f"an argument of {where}", item)
    return list(given)


def _input_words(graph, inputs_taken: int) -> str:
    return " ".join(graph.inputs[inputs_taken:])


def _definition(head, graphs: dict, kind: str, label: str, builtins: tuple):
    if not isinstance(head, Symbol):
        raise type_error(f"the name of a {kind}", label, head)
    graph = graphs.get(head.name)
    if graph is None:
        names = [name for name, g in graphs.items() if g.kind == kind] + list(builtins)
        listed = ", ".join(names) if names else "none"
        raise SexpgpuError(
            "E-FORM-007",
            f"{label} names '{head.name}', but the file has no {kind} of that name (known: {listed}).",
            head.loc,
            did_you_mean(head.name, names),
        )
    if graph.kind != kind:
        raise SexpgpuError(
            "E-FORM-008",
            f"{label} needs a {kind}, but '{head.name}' is a {graph.kind} (at {graph.loc}).",
            head.loc,
        )
    return graph
