"""The checked forms of a file: what the forms stage hands to the graph stage.

Graph bodies stay as syntax (with locations) so that the graph stage can report shape and
dtype errors at the exact place in the file. Everything else is resolved to plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sexpgpu.errors import Location
from sexpgpu.lang.syntax import SList


@dataclass(frozen=True)
class GraphDef:
    """`(defgraph NAME (INPUT ...) [:OPTION DEFAULT]... BODY...)` or a `defgenerator`."""

    name: str
    inputs: tuple[str, ...]
    options: dict  # option name -> default (int, float, str or bool)
    body: tuple  # syntax: (let NAME EXPR)... then the result expression
    is_generator: bool
    loc: Location
    option_locs: dict = field(default_factory=dict)  # option name -> Location of its keyword
    record_fields: tuple[str, ...] = ()  # a generator: the fields of its final (record ...)

    @property
    def kind(self) -> str:
        return "defgenerator" if self.is_generator else "defgraph"


@dataclass(frozen=True)
class Call:
    """`(NAME ARG ... :OPTION VALUE ...)` in a defrun: a graph applied to record fields."""

    name: str
    args: tuple[str, ...]
    options: dict  # every option of the graph, in definition order: the call's value or the default
    loc: Location
    arg_locs: tuple = ()  # Location of each of args


@dataclass(frozen=True)
class InitSpec:
    """A parameter's initializer: `zeros`, `(normal :std 0.02)`, ... (docs/language.md)."""

    kind: str  # "zeros" | "ones" | "normal" | "uniform" | "truncated-normal" | "glorot-uniform" | ...
    args: dict  # keyword (with '-' as '_') -> float, every keyword of the kind, defaults filled
    loc: Location | None = None


@dataclass(frozen=True)
class DataSpec:
    kind: str  # "records" | "text" | "generator"
    path: str | None = None  # records: the file, relative paths joined to the experiment file's folder
    shuffle: bool = False
    corpus: str | None = None  # text: "pydoc"
    context: int | None = None  # text: bytes per record
    generator: Call | None = None  # generator: the defgenerator and its options
    loc: Location | None = None


@dataclass(frozen=True)
class LossSpec:
    kind: str  # "cross-entropy" | "mse" | "graph"
    fields: tuple[str, ...]  # the record fields the loss reads after the model output
    graph: Call | None = None
    loc: Location | None = None
    field_locs: tuple = ()  # Location of each of fields


@dataclass(frozen=True)
class OptimizerSpec:
    kind: str  # "sgd" | "momentum" | "adam" | "adamw"
    lr: float
    momentum: float = 0.9
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip: float = float("inf")
    loc: Location | None = None


@dataclass(frozen=True)
class ScheduleSpec:
    kind: str = "constant"  # "constant" | "warmup" | "cosine"
    warmup: int = 0
    min_lr: float = 0.0
    loc: Location | None = None


@dataclass(frozen=True)
class PassSpec:
    kind: str  # "eval"
    every: int
    batches: int = 1
    data: DataSpec | None = None  # None: the run's own data
    name: str | None = None
    loc: Location | None = None


@dataclass(frozen=True)
class CheckpointSpec:
    every: int
    keep: int | None = None  # None: keep all
    to: str | None = None  # None: the run directory
    loc: Location | None = None


@dataclass(frozen=True)
class DiagnosticsSpec:
    """The diagnostics selection: every `every`-th step runs the diagnosed graph for its first
    microbatch (docs/tools.md, "Diagnostics")."""

    every: int
    loc: Location | None = None


@dataclass(frozen=True)
class RunDef:
    name: str
    seed: int
    data: DataSpec
    model: Call
    loss: LossSpec
    optimizer: OptimizerSpec
    schedule: ScheduleSpec
    batch: int
    microbatches: int
    steps: int
    passes: tuple[PassSpec, ...] = ()
    checkpoint: CheckpointSpec | None = None
    diagnostics: DiagnosticsSpec | None = None
    loc: Location | None = None
    precision: str = "f32"  # "bf16": products in bf16 with float32 sums (graph/passes/precision.py)
    arithmetic: str = "float"  # "exact": every sum exact and rounded once (docs/determinism.md, "Exact runs")


@dataclass(frozen=True)
class Experiment:
    """Every form of one file, and the run a selection picked."""

    path: str
    graphs: dict  # name -> GraphDef (defgraph and defgenerator share one namespace)
    runs: dict  # name -> RunDef, in file order
    source_sha256: str = ""
    selected: str | None = None

    @property
    def run(self) -> RunDef:
        return self.runs[self.selected]
