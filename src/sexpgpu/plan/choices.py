"""The machine's choices: every decision that can move a run's bits, one entry each.

A decision is a `Decision` record with the same five facets (determinism.md, "What a run
chooses"):
- `make`: how it is made, from a `DeviceProbe` (plan/device.py), measuring if need be;
- `remembered`: which cache file keeps it ("choices", "cost", or "" for nowhere) and
  `cache_key`: under which key, beyond the identity the cache adds (plan/cache.py);
- `strict`: what `--deterministic` takes, a fixed rule;
- the record's JSON key is the entry's `key` in the `choices` object;
- `check_pin`: None when this machine can take a recorded value, else the E-CHOICE-001 reason.

`decide` walks `DECISIONS` in order, so adding a decision is one entry here; the run loop
reads the resulting `Choices` record and nothing else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.training.stacking import stack_training
from sexpgpu.plan.cost import CostModel
from sexpgpu.plan.device import DeviceProbe, Throughput
from sexpgpu.plan.memory import gib_text

ORDINARY = "ordinary"
STRICT_RECOMPUTE = 9.0  # flops a byte: the A100's, what --deterministic takes
COST_MODEL_LEAD = 0.05  # the cost model's pick is taken when ahead of the next by more than this
PRODUCT_LEAD = 0.01  # another product implementation replaces ordinary when this much faster
CONVOLUTION_CANDIDATES = 8  # the first this many engines the device's library offers are timed
DEFAULT_NODE_GRADIENTS = "bf16"
RECORD_KEYS = ("device", "strict", "stacking", "recompute", "convolutions", "products", "node_gradients")


@dataclass(frozen=True)
class Choices:
    """What a run chose, as recorded under `choices` in experiment.json (checkpoints, run
    directory) and in the lowering annotation's metadata."""

    device: str  # DeviceFacts.line(), or the CPU interpreter's name
    strict: bool  # made under --deterministic
    stacking: int
    recompute: float | None  # None where no fusion planner runs (the CPU interpreter)
    convolutions: dict = field(default_factory=dict)  # the device's convolution key -> its engine
    products: dict | None = field(default_factory=dict)  # ProductShape.key() -> implementation; None: not recorded
    node_gradients: str | None = DEFAULT_NODE_GRADIENTS  # None on one node, where none are sent

    def to_json(self) -> dict:
        return {key: getattr(self, key) for key in RECORD_KEYS}

    def value(self, key: str):
        return getattr(self, key)


def choices_from_json(record, source: str) -> Choices:
    """A recorded `choices` object read back; E-CHOICE-003 when it is not one."""
    if not isinstance(record, dict) or not isinstance(record.get("stacking"), int) or \
            not isinstance(record.get("device"), str):
        raise SexpgpuError("E-CHOICE-003", f"{source} holds no choices object with a device and a stacking degree: "
                                           f"found {str(record)[:80]}.",
                           hint="Pin to a checkpoint, an experiment.json or a lowering annotation written by "
                                "sexpgpu run, or run with --choices fresh.")
    products = record.get("products")
    return Choices(record["device"], bool(record.get("strict", False)), record["stacking"], record.get("recompute"),
                   dict(record.get("convolutions") or {}), dict(products) if isinstance(products, dict) else None,
                   record.get("node_gradients"))


@dataclass
class Situation:
    """What a decision is made from: the device, the run's graphs, and the settings."""

    probe: DeviceProbe
    training: object  # TrainingGraph, unstacked
    stackable: bool  # Program.stackable: False when a salt or generator keeps the run unstacked
    microbatches: int
    node_gradients: str  # SEXPGPU_NODE_GRADIENTS
    gpus: int = 1
    nodes: int = 1  # gradients go between nodes only when there are several
    first_step_inputs: Callable[[], dict] = dict  # the first step's inputs, for a measurement at that step
    notes: list = field(default_factory=list)  # what the report says of how the choices were made
    free_bytes: int | None = None  # asked once, with the degrees offered
    offered: tuple | None = None
    memory: object = None  # where the measured throughput is remembered (the cost file); set by `decide`
    measured_throughput: Throughput | None = None
    decided: dict = field(default_factory=dict)  # the values decided (or pinned) so far, by record key
    passes: tuple = ()  # the evaluation graphs the run also executes: their convolutions have engines too

    def offered_degrees(self) -> tuple:
        """The stacking degrees this run may take here: divisors of :microbatches (only 1 when
        the program is not stackable) whose memory plan fits the free device memory."""
        if self.offered is None:
            self.free_bytes = self.probe.free_memory_bytes()
            candidates = [degree for degree in range(1, self.microbatches + 1)
                          if self.microbatches % degree == 0 and (degree == 1 or self.stackable)]
            fitting = tuple(degree for degree in candidates
                            if self.probe.training_peak_bytes(self.training, degree) <= self.free_bytes)
            self.offered = fitting or (1,)
            self.notes.append(f"stacking degrees {_listed(self.offered)} fit {gib_text(self.free_bytes)} free"
                              + (f" (of {_listed(candidates)})" if fitting != tuple(candidates) else ""))
        return self.offered

    def throughput(self) -> Throughput:
        """The device's throughput, measured once and kept in the cost file: the cost model
        and the recompute budget both read it."""
        if self.measured_throughput is None:
            memory = self.memory or Forgetful()
            remembered = memory.lookup("cost", "throughput")
            if _is_throughput(remembered):
                self.measured_throughput = Throughput(**remembered)
            else:
                self.measured_throughput = self.probe.measure_throughput()
                kept = memory.remember("cost", "throughput", asdict(self.measured_throughput), _is_throughput)
                self.measured_throughput = Throughput(**kept)
        return self.measured_throughput

    def running_training(self):
        """The training graph the run steps through: at the stacking degree decided so far
        (stacking is the first decision, so every later one sees the graph it is about)."""
        return stack_training(self.training, self.decided.get("stacking", 1))

    def all_product_shapes(self) -> list:
        """The float32 products of the running graphs as this device runs them (its keys)."""
        return _each_once(self.running_training().graphs, self.probe.product_shapes)

    def product_shapes(self) -> list:
        """The products the device offers more than one implementation for; the device
        decides which are long enough to."""
        return [shape for shape in self.all_product_shapes() if len(self.probe.product_implementations(shape)) > 1]

    def all_convolution_keys(self) -> list:
        """The convolutions of the running graphs and the passes, as this device runs them."""
        return _each_once((*self.running_training().graphs, *self.passes), self.probe.convolution_keys)

    def convolution_keys(self) -> list:
        """The convolutions the device offers engines for; the others run its own way."""
        return [key for key in self.all_convolution_keys() if self.probe.convolution_engines(key)]


@dataclass(frozen=True)
class Decision:
    key: str  # the JSON key in the `choices` record
    make: Callable[[Situation], object]
    remembered: str  # "choices" (choices.json), "cost" (the cost file) or "" (nowhere)
    cache_key: Callable[[Situation], str]
    strict: Callable[[Situation], object]
    check_pin: Callable[[Situation, object], str | None]


# --- stacking -----------------------------------------------------------------------------

def _make_stacking(situation: Situation) -> int:
    offered = situation.offered_degrees()
    if len(offered) == 1:
        return offered[0]
    model = CostModel(situation.throughput())
    predicted = {degree: model.step_seconds(situation.training, degree) for degree in offered}
    ranked = sorted(offered, key=lambda degree: (predicted[degree], degree))
    if predicted[ranked[1]] > predicted[ranked[0]] * (1 + COST_MODEL_LEAD):
        situation.notes.append(f"stacking {ranked[0]}: the cost model's pick, ahead by more than "
                               f"{COST_MODEL_LEAD:.0%}")
        return ranked[0]
    inputs = situation.first_step_inputs()
    timed = {degree: situation.probe.time_training_step(situation.training, degree, inputs) for degree in offered}
    chosen = min(offered, key=lambda degree: (timed[degree], degree))
    situation.notes.append(f"stacking {chosen}: measured at the first step ("
                           + ", ".join(f"{degree}: {timed[degree] * 1e3:.3g} ms" for degree in offered) + ")")
    return chosen


def _stacking_key(situation: Situation) -> str:
    return f"degrees {_listed(situation.offered_degrees())}"


def _check_stacking(situation: Situation, degree) -> str | None:
    if not isinstance(degree, int) or degree < 1 or situation.microbatches % degree:
        return f"stacking {degree} does not divide this run's {situation.microbatches} microbatches"
    if degree > 1 and not situation.stackable:
        return (f"stacking {degree}: this run is kept unstacked (a draw's salt or the generator reads "
                ":microbatch, :records, :stage-records or a field, or the generator has bf16 nodes)")
    if degree not in situation.offered_degrees():
        return (f"stacking {degree}: its memory plan needs "
                f"{gib_text(situation.probe.training_peak_bytes(situation.training, degree))} and "
                f"{gib_text(situation.free_bytes)} is free")
    return None


def exact_stacking(microbatches: int, stackable: bool) -> int:
    """An exact run's stacking degree on a device backend: every microbatch of a step in one
    call, when the program stacks. Under :arithmetic exact a stacked call's sums over the batch
    and the unstacked calls' sums added exactly are one sum, rounded once, so no degree changes
    a bit; one call a step rounds each gradient straight from its operands (no digits formed)
    and queues the step in the fewest launches. Nothing is measured: a stacked call that
    cannot allocate goes on unstacked (run/loop.py), which changes no bit either."""
    return microbatches if stackable else 1


# --- long float32 products ----------------------------------------------------------------

def _make_products(situation: Situation) -> dict:
    chosen = {}
    for shape in situation.product_shapes():
        offered = situation.probe.product_implementations(shape)
        if situation.gpus > 1:
            chosen[shape.key()] = ORDINARY
            continue
        timed = {name: situation.probe.time_product(shape, name) for name in offered}
        fastest = min(offered, key=lambda name: (timed[name], name != ORDINARY))
        faster = timed[fastest] <= timed[ORDINARY] * (1 - PRODUCT_LEAD)
        chosen[shape.key()] = fastest if faster else ORDINARY
    return chosen


def _strict_products(situation: Situation) -> dict:
    return {shape.key(): ORDINARY for shape in situation.product_shapes()}


def _products_key(situation: Situation) -> str:
    return "products " + ", ".join(shape.key() for shape in situation.product_shapes())


def _check_products(situation: Situation, recorded) -> str | None:
    if recorded is None:  # recorded before product implementations were: its run took ordinary
        return None
    for shape in situation.all_product_shapes():
        offered = situation.probe.product_implementations(shape)
        name = recorded.get(shape.key())
        if name is None and len(offered) > 1:
            return f"the product {shape.key()} has no recorded implementation"
        if name is not None and name not in offered:
            return f"the product {shape.key()}: this device does not offer '{name}'"
    return None


# --- the rest -----------------------------------------------------------------------------

def _make_recompute(situation: Situation) -> float:
    return round(situation.throughput().flops_per_byte, 2)


def _check_recompute(situation: Situation, budget) -> str | None:
    ok = isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget >= 0
    return None if ok else f"the recompute budget {budget!r} is not a number of flops a byte"


# --- convolution engines -----------------------------------------------------------------

def _make_convolutions(situation: Situation) -> dict:
    """For each convolution: the engine remembered for its role, shape and dtype on this
    device, else the fastest of the first CONVOLUTION_CANDIDATES offered, timed once and
    remembered (an earlier engine wins a tie). Each is remembered on its own ("engines":
    keyed by the device and the convolution, not by the run's graphs), so a convolution
    met again in another model is not timed again. On several GPUs each would time its own
    and might choose otherwise, so every one takes the first offered, untimed, as products
    take ordinary there."""
    memory = situation.memory or Forgetful()
    chosen = {}
    for key in situation.convolution_keys():
        offered = situation.probe.convolution_engines(key)
        if situation.gpus > 1:
            chosen[key.key()] = offered[0]
            continue
        cache_key = f"convolutions/{key.key()}"
        remembered = memory.lookup("engines", cache_key)
        if remembered in offered:
            chosen[key.key()] = remembered
            continue
        candidates = offered[:CONVOLUTION_CANDIDATES]
        timed = [situation.probe.time_convolution(key, engine) for engine in candidates]
        fastest = candidates[min(range(len(candidates)), key=lambda index: (timed[index], index))]
        chosen[key.key()] = memory.remember("engines", cache_key, fastest, lambda value: value in offered)
    _note_unavailable(situation)
    return chosen


def _strict_convolutions(situation: Situation) -> dict:
    """--deterministic: the first engine the device's library offers, nothing timed."""
    chosen = {key.key(): situation.probe.convolution_engines(key)[0] for key in situation.convolution_keys()}
    _note_unavailable(situation)
    return chosen


def _note_unavailable(situation: Situation) -> None:
    why = situation.probe.convolutions_unavailable()
    if why and situation.all_convolution_keys():
        facts = situation.probe.device_facts()
        situation.notes.append(f"convolutions: {why}, so they run {facts.engines_otherwise} and no engine is recorded")


def _check_convolutions(situation: Situation, engines) -> str | None:
    """A recorded engine must be one this device offers for its convolution, and every
    convolution offered engines must have one; an empty map was recorded where none were
    offered (or before engines were recorded), and its run, like a run pinned to it, took
    PyTorch's convolutions."""
    if not isinstance(engines, dict):
        return f"the convolutions {str(engines)[:60]!r} are not a map of convolutions to engines"
    for key in situation.all_convolution_keys():
        offered = situation.probe.convolution_engines(key)
        engine = engines.get(key.key())
        if engine is None and engines and offered:
            return f"the convolution {key.key()} has no recorded engine"
        if engine is not None and engine not in offered:
            why = situation.probe.convolutions_unavailable()
            library = situation.probe.device_facts().engine_library
            return f"the convolution {key.key()}: {library} does not offer '{engine}' here" + \
                (f" ({why})" if why else "")
    return None


# --- gradients between nodes ---------------------------------------------------------------
# Only a run on several nodes sends any: one on one node records null and takes any record,
# whatever SEXPGPU_NODE_GRADIENTS says (a checkpoint of an older sexpgpu records its setting).

def node_gradients(nodes: int, setting: str, strict: bool = False) -> str | None:
    """The dtype of the gradients a run sends between nodes: None on one node; f32 under
    --deterministic; else SEXPGPU_NODE_GRADIENTS."""
    if nodes == 1:
        return None
    return "f32" if strict else setting


def node_gradients_refused(nodes: int, setting: str, recorded) -> str | None:
    """Why a run cannot take recorded gradients between nodes (E-CHOICE-001), or None."""
    if nodes == 1 or recorded is None or recorded == setting:
        return None
    return f"gradients between nodes were {recorded}, and SEXPGPU_NODE_GRADIENTS says {setting}"


def _node_gradients_taken(situation: Situation, recorded) -> str | None:
    """What a pinned run sends: the record's, which the pin checked; the setting where the
    record has none (a run on one node recorded null); nothing on one node."""
    return node_gradients(situation.nodes, recorded or situation.node_gradients)


def _is_throughput(value) -> bool:
    return isinstance(value, dict) and set(value) == {"flops_per_second", "bytes_per_second"}


def _fixed(value) -> Callable:
    return lambda situation: value


DECISIONS = (
    Decision("stacking", _make_stacking, "choices", _stacking_key, _fixed(1), _check_stacking),
    Decision("products", _make_products, "choices", _products_key, _strict_products, _check_products),
    Decision("recompute", _make_recompute, "cost", _fixed("recompute"), _fixed(STRICT_RECOMPUTE), _check_recompute),
    # remembered per convolution inside `make` (the "engines" entries of choices.json)
    Decision("convolutions", _make_convolutions, "", _fixed(""), _strict_convolutions, _check_convolutions),
    Decision("node_gradients", lambda situation: node_gradients(situation.nodes, situation.node_gradients), "",
             _fixed(""), lambda situation: node_gradients(situation.nodes, situation.node_gradients, strict=True),
             lambda situation, dtype: node_gradients_refused(situation.nodes, situation.node_gradients, dtype)),
)


class Forgetful:
    """A memory that remembers nothing. plan/cache.py's `ChoiceCache` has the same two methods
    and remembers in ~/.cache/sexpgpu."""

    def lookup(self, file: str, key: str):
        return None

    def remember(self, file: str, key: str, value, acceptable=None):
        return value


def decide(situation: Situation, memory) -> Choices:
    """The run's own choices: each taken from `memory` when it remembers one this machine can
    take (a damaged entry is not), else made now and remembered."""
    values = situation.decided = {}
    situation.memory = memory
    for decision in DECISIONS:
        key = decision.cache_key(situation)
        remembered = memory.lookup(decision.remembered, f"{decision.key}/{key}") if decision.remembered else None
        if remembered is not None and decision.check_pin(situation, remembered) is None:
            values[decision.key] = remembered
            continue
        values[decision.key] = decision.make(situation)
        if decision.remembered:  # another run may have remembered first: every run takes that one
            values[decision.key] = memory.remember(decision.remembered, f"{decision.key}/{key}", values[decision.key],
                                                   lambda value: decision.check_pin(situation, value) is None)
    return _record(situation, values, strict=False)


def decide_strictly(situation: Situation) -> Choices:
    """--deterministic: every choice by its fixed rule, nothing measured or remembered."""
    values = situation.decided = {}
    for decision in DECISIONS:
        values[decision.key] = decision.strict(situation)
    return _record(situation, values, strict=True)


def take_pinned(situation: Situation, recorded: Choices, source: str) -> Choices:
    """The recorded choices as they are, or E-CHOICE-001 naming the first one this machine
    cannot take. Never another choice in its place."""
    situation.decided = {}
    for decision in DECISIONS:
        reason = decision.check_pin(situation, recorded.value(decision.key))
        if reason is not None:
            raise SexpgpuError("E-CHOICE-001", f"this run is pinned to the choices of {source} and cannot take "
                                               f"its {decision.key}: {reason}.",
                               hint="Run with --choices fresh to choose again here (level 3), or on a machine "
                                    "that can take the recorded choices.")
        situation.decided[decision.key] = recorded.value(decision.key)
    products = recorded.products if recorded.products is not None else _strict_products(situation)
    return replace(recorded, device=situation.probe.device_facts().line(), products=products,
                   node_gradients=_node_gradients_taken(situation, recorded.node_gradients))


def _record(situation: Situation, values: dict, strict: bool) -> Choices:
    return Choices(situation.probe.device_facts().line(), strict, **values)


def _each_once(graphs, found) -> list:
    """What found(graph) lists over `graphs`, each item once, in order of first appearance."""
    return list(dict.fromkeys(item for graph in graphs for item in found(graph)))


def _listed(degrees) -> str:
    return ", ".join(str(degree) for degree in degrees)
