"""Graph bodies (syntax) to IR: names, constants, op calls, params, graph calls, repeat, draws.

A `Builder` evaluates the bodies of one graph being built (the microbatch graph, a pass, or
a generator) into one emitter. Evaluation is eager and in the order of the text, so node
creation order, parameter order of discovery and draw ordinals are fixed by the file.

Values: an expression gives a `Node`, or a static Python value (an integer, a float, true
or false, a string) that stays static until an op needs a tensor; a number then becomes a
constant of the other operand's dtype.

Names and keys (docs/language.md):
- a parameter's path is its scope, `/`, its name; scopes nest through `:as`, and `repeat`
  gives scopes PREFIX0, PREFIX1, ...; the model and loss graphs have the empty scope;
- a draw in the model or loss graph has the stream `SCOPE/OP#N`, N counting that op's draws
  in that scope (`OP#N` in the empty scope); a draw in a generator or a pass has the stream
  `GRAPH/draw#N`, N counting every draw of that graph.
"""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.graph.frontend.layers import BUILTINS
from sexpgpu.graph.frontend.records import Frame, LoadSpec, ParamSpec, initializer_of, join_path
from sexpgpu.graph.core.ops import OpError, dims_text
from sexpgpu.graph.core.ir import Node
from sexpgpu.lang.keywords import first_keyword, split_pairs
from sexpgpu.lang.limits import CALLS_MAX, DIM_MAX, I32_MAX, I32_MIN, REPEAT_MAX
from sexpgpu.lang.values import FLOAT_MAX
from sexpgpu.lang.syntax import Float, Integer, SList, String, Symbol, describe, shown

SPECIAL_FORMS = ("param", "repeat", "step", "trip")


class Builder:
    """Evaluates graph bodies into `emitter`. `mode` is "model", "pass" or "generator"."""

    def __init__(self, emitter, graphs: dict, *, seed: int, batch: int, mode: str, draw_graph: str = "",
                 training: bool = True, fields: dict | None = None):
        self.e = emitter
        self.graphs = graphs
        self.seed = seed
        self.batch = batch
        self.mode = mode
        self.draw_graph = draw_graph
        self.training = training
        self.fields = fields or {}  # name -> (shape of a microbatch, dtype)
        self.params: dict = {}  # path -> ParamSpec, in order of declaration
        self.param_nodes: dict = {}  # path -> input node
        self.field_nodes: dict = {}  # name -> input node
        self.scalar_nodes: dict = {}  # "step" | "microbatch" | "trip" -> input node
        self.salts_read: list = []  # every salt part read, in order ("microbatch", "field/x", ...)
        self._draws_in_scope: dict = {}
        self._draws_in_graph = 0
        self._call_count = 0
        self._calls: dict = {}  # the definitions being called, outermost first (a dict: a deep chain checks in O(1))

    # --- errors and emitting --------------------------------------------------------------

    def error(self, code: str, message: str, loc, hint: str | None = None) -> SexpgpuError:
        return SexpgpuError(code, message, loc, hint)

    def emit(self, op: str, *inputs: Node, **attrs) -> Node:
        try:
            return self.e(op, *inputs, **attrs)
        except OpError as error:
            raise SexpgpuError(error.code, error.message, self.e.loc) from None

    def const(self, value, like: Node | None = None, dtype: str | None = None) -> Node:
        try:
            return self.e.const(value, like=like, dtype=dtype)
        except OpError as error:
            raise SexpgpuError(error.code, error.message, self.e.loc) from None

    def tensor(self, value, like: Node | None = None) -> Node:
        """A node for `value`: itself, or a constant of `like`'s dtype (f32 without one)."""
        if isinstance(value, Node):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error("E-GRAPH-003", f"expected a tensor or a number, found {_static_text(value)}.", self.e.loc)
        if isinstance(value, int) and abs(value) > FLOAT_MAX:
            raise self.error("E-FORM-011", "a number used as a tensor must be at most about 1.8e308 in size.",
                             self.e.loc)
        return self.const(value, like=like)

    def tensors(self, values) -> list:
        """Nodes for `values`; numbers take the dtype of the first tensor among them."""
        like = next((value for value in values if isinstance(value, Node)), None)
        return [self.tensor(value, like) for value in values]

    # --- inputs ---------------------------------------------------------------------------------

    def field(self, name: str, loc) -> Node:
        if name not in self.field_nodes:
            if name not in self.fields:
                known = sorted(self.fields)
                raise self.error(
                    "E-GRAPH-001",
                    f"no record field '{name}' in the data: its fields are {', '.join(known) or 'none'}.",
                    loc, did_you_mean(name, known),
                )
            shape, dtype = self.fields[name]
            with self.e.at(loc=loc):
                self.field_nodes[name] = self.e.input(f"field/{name}", dtype, shape)
        return self.field_nodes[name]

    def scalar(self, name: str, loc) -> Node:
        if name not in self.scalar_nodes:
            with self.e.at(loc=loc):
                self.scalar_nodes[name] = self.e.input(name, "i32", ())
        return self.scalar_nodes[name]

    def declare_param(self, frame: Frame, name: str, shape: tuple, dtype: str, init, load, loc) -> Node:
        path = join_path(frame.scope, name)
        if self.mode == "generator":
            raise self.error("E-GRAPH-003", f"a generator has no parameters, but this declares '{path}': "
                                            "draw its values instead (normal, uniform, ...).", loc)
        spec = ParamSpec(path, tuple(shape), dtype, init, load, loc)
        existing = self.params.get(path)
        if existing is not None:
            if existing != spec:
                raise self.error(
                    "E-GRAPH-004",
                    f"parameter '{path}' is declared again with another shape, dtype or initializer "
                    f"({dims_text(shape)} {dtype} here, {dims_text(existing.shape)} {existing.dtype} at {existing.loc}).",
                    loc, "Give the second one another :as scope, or declare it alike to share it.",
                )
            return self.param_nodes[path]
        self.params[path] = spec
        with self.e.at(scope=frame.scope, loc=loc):
            self.param_nodes[path] = self.e.input(f"param/{path}", dtype, shape)
        return self.param_nodes[path]

    # --- draws ------------------------------------------------------------------------------------

    def draw(self, frame: Frame, op_name: str, ir_op: str, shape: tuple, params: dict, salts: tuple, loc) -> Node:
        stream = self._stream(frame, op_name)
        sources = tuple(self._salt_node(part, loc) for part in salts)
        attrs = dict(params, shape=tuple(shape), seed=self.seed, stream=stream, salts=tuple(salts))
        return self.emit(ir_op, *sources, **attrs)

    def _stream(self, frame: Frame, op_name: str) -> str:
        if self.mode == "model":
            key = (frame.scope, op_name)
            ordinal = self._draws_in_scope.get(key, 0)
            self._draws_in_scope[key] = ordinal + 1
            return join_path(frame.scope, f"{op_name}#{ordinal}")
        ordinal = self._draws_in_graph
        self._draws_in_graph += 1
        return f"{self.draw_graph}/draw#{ordinal}"

    def _salt_node(self, part: str, loc) -> Node:
        self.salts_read.append(part)
        if part == "trip" and self.mode != "generator":
            raise self.error("E-GRAPH-003", "the :trip salt exists only in generators, which a pass calls once a batch.", loc)
        if part in ("step", "microbatch", "trip"):
            return self.scalar(part, loc)
        name = part[len("field/"):]
        if self.mode == "generator":
            raise self.error("E-GRAPH-003", f"a generator has no record field '{name}' to salt with: it makes the fields.", loc)
        node = self.field(name, loc)
        if node.dtype != "i32" or node.rank > 1:
            raise self.error(
                "E-GRAPH-003",
                f"a salt field must hold one integer per record; '{name}' is {node.dtype} of shape {dims_text(node.shape)} a microbatch.",
                loc,
            )
        return node

    # --- evaluation -------------------------------------------------------------------------------

    # Evaluation nests as deep as the text and the calls do: thousands of levels in a legal
    # file. So it never recurses in Python. Each level is a generator of steps that yields a
    # generator for every value it needs from a level below, and `_drive` runs them from an
    # explicit stack, in exactly the order a recursive evaluator would.

    def evaluate(self, expression, frame: Frame):
        """The value of one expression: a Node or a static value."""
        return _drive(self.evaluation(expression, frame))

    def run_generator_body(self, graph, frame: Frame) -> dict:
        """A generator's fields: its lets in order, then its `(record :FIELD EXPR ...)`, as written."""
        return _drive(self._generator_body(graph, frame))

    def evaluation(self, expression, frame: Frame):
        """The steps of evaluating `expression` (a generator for `_drive`)."""
        if isinstance(expression, (Integer, Float, String)):
            return expression.value
        if isinstance(expression, Symbol):
            return self.lookup(expression, frame)
        if isinstance(expression, SList):
            with self.e.at(loc=expression.loc):
                return (yield from self._form(expression, frame))
        raise self.error("E-GRAPH-003", f"expected an expression, found {describe(expression)}.", expression.loc)

    def _body(self, graph, frame: Frame):
        """The value of a definition's body: its lets in order, then its result."""
        for binding in graph.body[:-1]:
            name, expression = binding.items[1], binding.items[2]
            frame.env[name.name] = yield self.evaluation(expression, frame)
        return (yield self.evaluation(graph.body[-1], frame))

    def _generator_body(self, graph, frame: Frame):
        for binding in graph.body[:-1]:
            frame.env[binding.items[1].name] = yield self.evaluation(binding.items[2], frame)
        record = graph.body[-1]
        fields = {}
        for name, (key, expression) in split_pairs(record.items[1:], "(record ...)").items():
            value = yield self.evaluation(expression, frame)
            if not isinstance(value, Node):
                raise self.error("E-GRAPH-003", f"record field :{name} must be a tensor, found {_static_text(value)}.", expression.loc)
            fields[name] = value
        return fields

    def lookup(self, symbol: Symbol, frame: Frame):
        if symbol.name in frame.env:
            return frame.env[symbol.name]
        if symbol.name == "batch":
            return self.batch
        if symbol.name in ("true", "false"):
            return symbol.name == "true"
        known = list(frame.env) + ["batch"]
        raise self.error(
            "E-GRAPH-001",
            f"'{symbol.name}' is not defined in {frame.graph_name}: expected an input, an option or an earlier let.",
            symbol.loc, did_you_mean(symbol.name, known),
        )

    def _form(self, form: SList, frame: Frame):
        if not form.items or not isinstance(form.items[0], Symbol):
            found = describe(form.items[0]) if form.items else "nothing"
            raise self.error("E-GRAPH-003", f"expected an op or graph name at the start of a form, found {found}.", form.loc)
        head = form.items[0].name
        if head == "param":
            return self.param_form(form, frame)
        if head == "repeat":
            return (yield from self._repeat(form, frame))
        if head in ("step", "trip"):
            return self.scalar_form(form, head)
        if head in BUILTINS:
            return (yield from BUILTINS[head].application(self, form, frame))
        if head in self.graphs:
            return (yield from self._graph_call(form, frame))
        known = list(BUILTINS) + list(SPECIAL_FORMS) + [name for name, g in self.graphs.items() if not g.is_generator]
        raise self.error(
            "E-GRAPH-002", f"unknown op '{head}': expected a built-in op, a layer or a defgraph.",
            form.items[0].loc, did_you_mean(head, known),
        )

    def scalar_form(self, form: SList, head: str) -> Node:
        if len(form.items) != 1:
            raise self.error("E-GRAPH-003", f"({head}) takes no arguments, found {len(form.items) - 1}.", form.items[1].loc)
        if head == "trip" and self.mode != "generator":
            raise self.error("E-GRAPH-003", "(trip) exists only in generators.", form.loc)
        return self.scalar(head, form.loc)

    # --- static arguments ------------------------------------------------------------------------

    def static(self, expression, frame: Frame, expected: str, accept):
        """A value known before running: a literal, or a name bound to one."""
        value = self.evaluate(expression, frame) if isinstance(expression, (Symbol, Integer, Float, String)) else None
        if value is None or isinstance(value, Node) or not accept(value):
            found = "a tensor" if isinstance(value, Node) else describe(expression)
            raise self.error("E-GRAPH-003", f"expected {expected}, found {found}.", expression.loc)
        return value

    def static_int(self, expression, frame: Frame, expected: str = "an integer", minimum: int = I32_MIN,
                   maximum: int = I32_MAX, maximum_text: str = "2^31-1", label: str | None = None) -> int:
        """A static integer; every one the graphs use fits int32 (docs/language.md, "Limits")."""
        value = self.static(expression, frame, expected, lambda v: isinstance(v, int) and not isinstance(v, bool))
        if not minimum <= value <= maximum:
            low = "-2^31" if minimum == I32_MIN else str(minimum)
            raise self.error("E-FORM-011", f"{label or expected} must be from {low} to {maximum_text}, "
                                           f"found {_value_text(expression, value)}.",
                             expression.loc)
        return value

    def static_size(self, expression, frame: Frame, label: str) -> int:
        """A width, a count of heads, a vocabulary: from 1 to 2^31-1."""
        return self.static_int(expression, frame, "an integer", 1, DIM_MAX, label=label)

    def static_number(self, expression, frame: Frame) -> float:
        value = self.static(expression, frame, "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
        if isinstance(value, int) and abs(value) > FLOAT_MAX:
            raise self.error("E-FORM-011", f"a number must be at most about 1.8e308 in size, found "
                                           f"{_value_text(expression, value)}.", expression.loc)
        return float(value)

    def static_bool(self, expression, frame: Frame) -> bool:
        return self.static(expression, frame, "true or false", lambda v: isinstance(v, bool))

    def dims(self, expression, frame: Frame, allow_unknown: bool = False) -> tuple:
        """`(DIM ...)`: integers or names of integer options; -1 where `allow_unknown`."""
        if not isinstance(expression, SList):
            raise self.error("E-GRAPH-003", f"expected a list of dimensions like (4 hidden), found {describe(expression)}.", expression.loc)
        dims = []
        for item in expression.items:
            dim = self.static_int(item, frame, "an integer dimension or an option's name", minimum=-(2**63))
            if dim > DIM_MAX:
                raise self.error("E-FORM-011", f"a dimension must be at most 2^31-1, found {_value_text(item, dim)}.",
                                 item.loc)
            if dim < 1 and not (allow_unknown and dim == -1):
                raise self.error("E-SHAPE-001", f"a dimension must be at least 1, found {dim}.", item.loc)
            dims.append(dim)
        return tuple(dims)

    # --- param, graph calls, repeat --------------------------------------------------------------

    def param_form(self, form: SList, frame: Frame) -> Node:
        from sexpgpu.lang.initializers import read_initializer

        end = 1 + first_keyword(form.items[1:])
        name, shape_syntax = form.items[1], form.items[2]
        shape = self.dims(shape_syntax, frame)
        keys = {key: value for key, (_, value) in split_pairs(form.items[end:], "(param ...)").items()}
        init = initializer_of(read_initializer(keys["init"])) if "init" in keys else None
        load = None
        if "load" in keys:
            path = join_path(frame.scope, name.name)
            load = LoadSpec(keys["load"].value, keys["tensor"].value if "tensor" in keys else path)
        dtype = keys["dtype"].name if "dtype" in keys else "f32"
        return self.declare_param(frame, name.name, shape, dtype, init, load, form.loc)

    def _graph_call(self, form: SList, frame: Frame):
        definition = self.graphs[form.items[0].name]
        if definition.is_generator:
            raise self.error("E-GRAPH-003", f"'{definition.name}' is a defgenerator; only a defgraph can be called here.", form.items[0].loc)
        end = 1 + first_keyword(form.items[1:])
        args = []
        for item in form.items[1:end]:
            args.append((yield self.evaluation(item, frame)))
        scope, options = self.call_keywords(form, end, frame, definition)
        if len(args) != len(definition.inputs):
            raise self.error(
                "E-GRAPH-003",
                f"'{definition.name}' takes {len(definition.inputs)} input(s) ({' '.join(definition.inputs)}), found {len(args)}.",
                form.loc,
            )
        return (yield from self._call(definition, args, options, join_path(frame.scope, scope) if scope else frame.scope, form.loc))

    def call_keywords(self, form: SList, end: int, frame: Frame, definition) -> tuple:
        """(the :as scope or None, the callee's options with the call's values)."""
        options = dict(definition.options)
        scope = None
        for name, (key, value) in split_pairs(form.items[end:], f"({definition.name} ...)").items():
            if name == "as":
                scope = self.scope_name(value)
            elif name in options:
                options[name] = self.static(value, frame, f"a value for option :{name}", lambda v: not isinstance(v, Node))
            else:
                raise self.error(
                    "E-GRAPH-003",
                    f"unknown keyword {key} for '{definition.name}': its options are "
                    f"{', '.join(':' + option for option in definition.options) or 'none'}, and :as.",
                    key.loc, did_you_mean(name, list(definition.options) + ["as"], ":"),
                )
        return scope, options

    def scope_name(self, value) -> str:
        if not isinstance(value, Symbol) or value.name.startswith("/") or value.name.endswith("/"):
            raise self.error("E-GRAPH-003", f"expected a scope name like block0 after :as, found {describe(value)}.", value.loc)
        return value.name

    def call(self, definition, args: list, options: dict, scope: str, loc):
        """The value of `definition` applied to `args` under `scope`."""
        return _drive(self._call(definition, args, options, scope, loc))

    def _call(self, definition, args: list, options: dict, scope: str, loc):
        if definition.name in self._calls:
            chain = " -> ".join(list(self._calls) + [definition.name])
            raise self.error("E-GRAPH-005", f"graph '{definition.name}' calls itself ({chain}).", loc)
        self._call_count += 1
        if self._call_count > CALLS_MAX:
            raise self.error("E-GRAPH-007", f"building this graph makes more than {CALLS_MAX:,} graph calls "
                                            "(repeat counts each): the file describes too large a graph.", loc)
        env = dict(options)
        env.update(zip(definition.inputs, args))
        self._calls[definition.name] = None
        try:
            with self.e.at(scope=scope):
                return (yield from self._body(definition, Frame(env, scope, definition.name)))
        finally:
            del self._calls[definition.name]

    def _repeat(self, form: SList, frame: Frame):
        end = 1 + first_keyword(form.items[1:])
        given = form.items[1:end]
        if len(given) != 3:
            raise self.error("E-GRAPH-003", f"(repeat N GRAPH X :as PREFIX) takes 3 arguments, found {len(given)}.", form.loc)
        count_syntax, graph_syntax, input_syntax = given
        count = self.static_int(count_syntax, frame, "a repeat count", minimum=-(2**63), maximum=2**63)
        if count < 1:
            raise self.error("E-GRAPH-003", f"a repeat count must be at least 1, found {count}.", count_syntax.loc)
        if count > REPEAT_MAX:
            raise self.error("E-FORM-011", f"a repeat count must be at most {REPEAT_MAX:,}, found "
                                           f"{_value_text(count_syntax, count)}.", count_syntax.loc)
        if not isinstance(graph_syntax, Symbol) or graph_syntax.name not in self.graphs:
            names = [name for name, g in self.graphs.items() if not g.is_generator]
            found = graph_syntax.name if isinstance(graph_syntax, Symbol) else describe(graph_syntax)
            raise self.error("E-GRAPH-002", f"repeat: unknown graph '{found}'.", graph_syntax.loc,
                             did_you_mean(found, names) if isinstance(graph_syntax, Symbol) else None)
        definition = self.graphs[graph_syntax.name]
        if definition.is_generator or len(definition.inputs) != 1:
            raise self.error("E-GRAPH-003", f"repeat needs a defgraph of one input; '{definition.name}' has {len(definition.inputs)}.", graph_syntax.loc)
        prefix, options = self.call_keywords(form, end, frame, definition)
        if prefix is None:
            raise self.error("E-GRAPH-003", "repeat needs :as PREFIX: its calls live in scopes PREFIX0, PREFIX1, ...", form.loc)
        value = yield self.evaluation(input_syntax, frame)
        for index in range(count):
            value = yield self._call(definition, [value], options, join_path(frame.scope, f"{prefix}{index}"), form.loc)
        return value


def _drive(steps):
    """Run a generator of evaluation steps to its value. A step yields a generator whose value
    it needs; that generator runs on top of the stack and its value is sent back. No Python
    recursion, so depth is bounded by memory, not by the interpreter's stack."""
    stack = [steps]
    value = None
    try:
        while stack:
            try:
                needed = stack[-1].send(value)
            except StopIteration as finished:
                stack.pop()
                value = finished.value
                continue
            stack.append(needed)
            value = None
    except BaseException:
        for pending in reversed(stack):
            pending.close()  # their `finally` blocks restore the scope, location and call chain
        raise
    return value


def _value_text(expression, value: int) -> str:
    """An integer for a message: its literal, shortened, or the option's value."""
    if isinstance(expression, Integer):
        return shown(expression)
    return shown(str(value)) if abs(value) < 10**400 else "a number of more than 400 digits"


def _static_text(value) -> str:
    if isinstance(value, str):
        return f'the string "{value}"'
    if isinstance(value, dict):
        return "a record"
    return repr(value)
