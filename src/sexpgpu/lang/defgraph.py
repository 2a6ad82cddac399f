"""`defgraph` and `defgenerator`: their header checked, their body checked for structure only.

The graph stage evaluates bodies. Here we check what is purely syntactic: the name, the input
list, the options, that a body is `(let NAME EXPR)...` then a result, that no name is bound
twice, that every call's keywords come in pairs after its arguments, and the literal
arguments whose meaning is fixed by the language: `:init`, `:salt`, `param`, and `:p`.
"""

from __future__ import annotations

from typing import NamedTuple

from sexpgpu.errors import Location, SexpgpuError
from sexpgpu.lang.experiment import GraphDef
from sexpgpu.lang.initializers import read_initializer
from sexpgpu.lang.keywords import Key, first_keyword, read_keys, split_pairs
from sexpgpu.lang.salts import read_salt
from sexpgpu.lang.syntax import Float, Integer, Keyword, SList, Symbol, describe
from sexpgpu.lang.values import literal, one_of, range_error, string, type_error

# Names the language gives a meaning to inside bodies and defruns; a definition may not take them.
RESERVED = ("let", "param", "repeat", "record", "field", "step", "trip", "batch", "cross-entropy", "mse")
GENERATOR_NAMES = ("batch",)  # what a generator body reads without declaring it

# The built-in ops whose `:init` is an initializer and whose `:salt` is a salt. A defgraph may
# have options of those names, so other heads are left to the graph stage.
INIT_OPS = ("linear", "embedding", "attention", "conv2d")
SALT_OPS = ("dropout", "normal", "uniform", "truncated-normal", "bernoulli", "randint")
# A `:p` literal of these ops is a probability; dropout's excludes 1 (it scales by 1/(1-p)).
_PROBABILITIES = {"dropout": (0.0, 1.0, True), "bernoulli": (0.0, 1.0, False)}

_PARAM_KEYS = {
    "init": Key(lambda value, label, context: read_initializer(value, label), None),
    "load": Key(string, None),
    "tensor": Key(string, None),
    "dtype": Key(one_of("f32", "bf16"), None),
}


def read_graph(form: SList, definition_name: Symbol) -> GraphDef:
    """A checked `(defgraph NAME (INPUT ...) [:OPTION DEFAULT]... BODY...)` or `defgenerator`."""
    is_generator = form.head == "defgenerator"
    where = f"{form.head} '{definition_name.name}'"
    bound: dict[str, Location | None] = {}  # None: a name the language provides
    inputs: tuple[str, ...] = ()
    rest = form.items[2:]
    if not is_generator:
        inputs = _read_inputs(form, where, bound)
        rest = form.items[3:]
    else:
        bound.update({name: None for name in GENERATOR_NAMES})
    options, option_locs, rest = _read_options(rest, where, bound)
    body = tuple(rest)
    record_fields = _check_body(form, body, where, bound, is_generator)
    return GraphDef(
        definition_name.name, inputs, options, body, is_generator, form.loc, option_locs, record_fields
    )


def _read_inputs(form: SList, where: str, bound: dict) -> tuple[str, ...]:
    if len(form.items) < 3:
        raise SexpgpuError(
            "E-FORM-009", f"{where} has no input list: expected (defgraph NAME (INPUT ...) BODY...).", form.loc
        )
    inputs = form.items[2]
    if not isinstance(inputs, SList):
        raise type_error("a list of input names like (x)", f"the inputs of {where}", inputs)
    for item in inputs.items:
        if not isinstance(item, Symbol):
            raise type_error("a symbol naming an input", f"an input of {where}", item)
        _bind(item, bound, where)
    return tuple(item.name for item in inputs.items)


def _read_options(items, where: str, bound: dict):
    """The `:OPTION DEFAULT` pairs that open the rest of the form, and what follows them."""
    end = 0
    while end < len(items) and isinstance(items[end], Keyword):
        end += 2
    pairs = split_pairs(items[:end], where)
    options, option_locs = {}, {}
    for name, (key, value) in pairs.items():
        _bind(Symbol(name, key.loc), bound, where)
        options[name] = literal(value, f"the default of option {key} in {where}")
        option_locs[name] = key.loc
    return options, option_locs, items[end:]


def _bind(name: Symbol, bound: dict, where: str) -> None:
    if name.name in bound and bound[name.name] is None:
        raise SexpgpuError(
            "E-FORM-013", f"'{name.name}' is given by the language in {where}: choose another name.", name.loc
        )
    if name.name in bound:
        raise SexpgpuError(
            "E-FORM-013",
            f"'{name.name}' is already bound in {where} (at {bound[name.name]}): "
            "inputs, options and lets each need their own name.",
            name.loc,
        )
    bound[name.name] = name.loc


def _check_body(form: SList, body: tuple, where: str, bound: dict, is_generator: bool) -> tuple[str, ...]:
    if not body:
        raise SexpgpuError(
            "E-FORM-012", f"{where} has no body: expected at least one expression before its ')'.", form.end or form.loc
        )
    for binding in body[:-1]:
        _check_let(binding, where, bound)
    result = body[-1]
    if isinstance(result, SList) and result.head == "let":
        raise SexpgpuError(
            "E-FORM-012",
            f"the last form of {where} is a let, but the last form is the graph's result: "
            "add the result expression after it.",
            result.loc,
        )
    if is_generator:
        return _check_record(result, where)
    check_expression(result, where)
    return ()


def _check_let(binding, where: str, bound: dict) -> None:
    if not (isinstance(binding, SList) and binding.head == "let"):
        raise SexpgpuError(
            "E-FORM-012",
            f"expected (let NAME EXPR) in {where}, found {describe(binding)}: "
            "only the last form of a body is its result.",
            binding.loc,
        )
    if len(binding.items) != 3:
        found = _count(len(binding.items) - 1, "item")
        raise SexpgpuError("E-FORM-009", f"(let ...) takes a name and one expression, found {found}.", binding.loc)
    name = binding.items[1]
    if not isinstance(name, Symbol):
        raise type_error("a symbol", "the name of a let", name)
    check_expression(binding.items[2], where)
    _bind(name, bound, where)


def _check_record(result, where: str) -> tuple[str, ...]:
    if not (isinstance(result, SList) and result.head == "record"):
        raise SexpgpuError(
            "E-FORM-012", f"the last form of {where} must be (record :FIELD EXPR ...), found {describe(result)}.",
            result.loc,
        )
    if len(result.items) < 3:
        raise SexpgpuError("E-FORM-009", f"(record ...) in {where} needs at least one :FIELD EXPR pair.", result.loc)
    pairs = split_pairs(result.items[1:], f"(record ...) in {where}")
    for _, value in pairs.values():
        check_expression(value, where)
    return tuple(pairs)


def check_expression(expression, where: str) -> None:
    """Check the syntax of one expression of a body, and of every expression inside it.

    The expressions inside are checked in the order of the text, from a stack rather than by
    recursion: a legal body may nest thousands of calls deep."""
    pending = [expression]
    while pending:
        task = pending.pop()
        if isinstance(task, _Argument):
            _check_argument(task.head, task.name, task.value)
            continue
        pending.extend(reversed(_check_one(task, where)))


class _Argument(NamedTuple):
    """A keyword argument of a call, to check before the expressions inside its value."""

    head: str
    name: str
    value: object


def _check_one(expression, where: str) -> list:
    """Check one expression's own syntax; what to check inside it next, in the text's order."""
    if not isinstance(expression, SList):
        return []
    head = expression.head
    if head in ("let", "record"):
        place = "the top of a body" if head == "let" else "the end of a defgenerator"
        raise SexpgpuError("E-FORM-012", f"({head} ...) may only appear at {place}.", expression.loc)
    if head is None:
        return list(expression.items)
    if head == "param":
        _check_param(expression, where)
        return []
    end = 1 + first_keyword(expression.items[1:])
    pairs = split_pairs(expression.items[end:], f"({head} ...)")
    tasks = list(expression.items[1:end])
    for name, (_, value) in pairs.items():
        tasks += [_Argument(head, name, value), value]
    return tasks


def _check_argument(head: str, name: str, value) -> None:
    if name == "init" and head in INIT_OPS:
        read_initializer(value)
    elif name == "salt" and head in SALT_OPS:
        read_salt(value)
    elif name == "p" and head in _PROBABILITIES and isinstance(value, (Integer, Float)):
        low, high, open_high = _PROBABILITIES[head]
        if not (low <= value.value < high if open_high else low <= value.value <= high):
            condition = "at least 0 and less than 1" if open_high else "from 0 to 1"
            raise range_error(f":p of ({head} ...)", condition, value)


def _check_param(expression: SList, where: str) -> None:
    """`(param NAME (DIM ...) :init INIT [:dtype bf16])` or `... :load "FILE" [:tensor "KEY"]`."""
    end = 1 + first_keyword(expression.items[1:])
    given = expression.items[1:end]
    if len(given) != 2:
        place = given[2].loc if len(given) > 2 else expression.loc
        raise SexpgpuError(
            "E-FORM-009", f"(param ...) takes a name and a shape, found {len(given)} arguments: "
            "expected (param NAME (DIM ...) :init INIT).", place,
        )
    name, shape = given
    if not isinstance(name, Symbol):
        raise type_error("a symbol", "the name of a param", name)
    _check_shape(shape)
    keys = read_keys(expression.items[end:], _PARAM_KEYS, f"(param {name.name} ...)", expression)
    if keys["init"] is None and keys["load"] is None:
        raise SexpgpuError(
            "E-FORM-004", f"(param {name.name} ...) has neither :init nor :load: expected one of them.", expression.loc
        )
    if keys["init"] is not None and keys["load"] is not None:
        raise SexpgpuError(
            "E-FORM-016", f"(param {name.name} ...) has both :init and :load: a parameter starts from one.",
            expression.loc,
        )
    if keys["tensor"] is not None and keys["load"] is None:
        raise SexpgpuError("E-FORM-016", f"(param {name.name} ...) has :tensor without :load.", expression.loc)


def _check_shape(shape) -> None:
    if not isinstance(shape, SList):
        raise type_error("a shape like (4 hidden)", "the shape of a param", shape)
    for dim in shape.items:
        if isinstance(dim, Integer):
            if dim.value < 1:
                raise range_error("a dimension of a param", "at least 1", dim)
        elif not isinstance(dim, Symbol):
            raise type_error("an integer or an option's name", "a dimension of a param", dim)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
