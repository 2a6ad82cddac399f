"""A tier computed in-process under choices that level 3 allows a machine to make otherwise
(docs/ladder.md, "Envelopes"): the envelope's sources, and the exact-mode rows' runs.

A variation is a list of segments, each the choices from one step on: the stacking degree
and, on a device that makes choices, each long float32 product's implementation, each
convolution's engine and the recompute budget. A segment that starts after step 1 is a spot
job resumed on another machine that chose again: its state carries over through host
arrays, as a checkpoint carries it, into a backend built afresh. The choices are taken as a
pin is (plan/choices.py's `take_pinned`), so a device that cannot take one says so
(E-CHOICE-001) rather than compute something else."""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass, field

from sexpgpu.plan.choices import CONVOLUTION_CANDIDATES, STRICT_RECOMPUTE, Choices, Situation, take_pinned
from sexpgpu.run import choosing
from sexpgpu.run.choosing import choice_settings, stacked_training
from sexpgpu.run.loop import Stacking, Trainer
from sexpgpu.run.setup import build_run

SEEDS = 4  # drawn variations, on a device that makes choices
SWITCH_CHANCE = 0.5  # how often a drawn variation is a resume that chose again
# The recompute budgets a draw takes from, --deterministic's first: a segment without a
# seed takes the first of each list it draws from (ordinary products, the first engine).
RECOMPUTE_BUDGETS = (STRICT_RECOMPUTE, STRICT_RECOMPUTE / 2, STRICT_RECOMPUTE * 2)


@dataclass(frozen=True)
class Segment:
    start: int  # the first step computed with these choices
    stacking: int
    seed: str | None = None  # what the products, engines and budget are drawn from; None: the first of each


@dataclass(frozen=True)
class Variation:
    name: str
    segments: tuple


@dataclass
class Computed:
    records: list  # each step's metrics record
    state: dict  # the final parameters and optimizer state, as host arrays
    segments: list = field(default_factory=list)  # {"from": step, "choices": the choices taken}

    @property
    def loss(self) -> list:
        return [record["loss"] for record in self.records]


def offered_degrees(built) -> tuple:
    """The stacking degrees this device offers the run: divisors of :microbatches that fit
    its memory (plan/choices.py), every divisor on the CPU interpreter, 1 when unstackable."""
    probe = choosing.backend_probe(built.backend)  # looked up at the call: tests stand a device in
    if probe is not None:
        return _situation(built, probe).offered_degrees()
    microbatches = built.experiment.run.microbatches
    return tuple(degree for degree in range(1, microbatches + 1)
                 if microbatches % degree == 0 and (degree == 1 or built.program.stackable))


def envelope_variations(name: str, built) -> list:
    """The variations an envelope is made of on this device: each offered degree from step
    1; each degree resumed at the middle step under the next one's choices; and on a device
    that makes choices, SEEDS draws of degrees, implementations, engines and budgets."""
    degrees = list(offered_degrees(built))
    steps = built.experiment.run.steps
    middle = steps // 2 + 1
    fixed = [fixed_variation(degree) for degree in degrees]
    switched = [Variation(f"stacking {first}, then {then} from step {middle}", (Segment(1, first), Segment(middle, then)))
                for first, then in zip(degrees, degrees[1:] + degrees[:1])] if len(degrees) > 1 else []
    drawn = [_drawn(name, seed, degrees, steps) for seed in range(1, SEEDS + 1)] \
        if choosing.backend_probe(built.backend) is not None else []
    return fixed + switched + drawn


def _drawn(name: str, seed: int, degrees: list, steps: int) -> Variation:
    draw = random.Random(f"{name}/{seed}")  # a string seed: the same draws on every machine and Python
    starts = [1] + ([draw.randint(2, steps)] if steps > 1 and draw.random() < SWITCH_CHANCE else [])
    segments = tuple(Segment(start, draw.choice(degrees), f"{name}/{seed}/{start}") for start in starts)
    shown = ", then ".join(f"stacking {segment.stacking}" + (f" from step {segment.start}" if segment.start > 1 else "")
                           for segment in segments)
    return Variation(f"seed {seed}: {shown}; products, engines and budget drawn", segments)


def fixed_variation(degree: int) -> Variation:
    """One stacking degree from step 1, and the first of every other choice."""
    return Variation(f"stacking {degree}", (Segment(1, degree),))


def compute(experiment, device: str, variation: Variation, steps: int | None = None) -> Computed:
    """The run's first `steps` steps (all of them by default) under the variation's choices."""
    steps = steps or experiment.run.steps
    ends = [segment.start - 1 for segment in variation.segments[1:]] + [steps]
    computed, host = Computed([], {}), None
    for segment, end in zip(variation.segments, ends):
        if segment.start > steps:
            break
        built = build_run(experiment, device)
        choices = segment_choices(built, segment)
        built.backend.take_choices(choices)
        state = built.initial_state() if host is None else host.moved(built.backend.from_host)
        degree = choices.stacking
        trainer = Trainer(experiment.run, built.program, built.backend, built.feeder,
                          Stacking(stacked_training(built.program, degree), degree, pinned=True))
        while state.step < min(end, steps):
            computed.records.append(trainer.step(state))
        computed.segments.append({"from": segment.start, "choices": choices.to_json()})
        host = state.moved(built.backend.to_host)
        del built, trainer, state
        gc.collect()  # this segment's backend and its device memory go before the next one's come
    computed.state = {**host.params, **host.optimizer}
    return computed


def segment_choices(built, segment: Segment) -> Choices:
    """The segment's choices as this device takes them. The CPU interpreter's only one is the
    stacking degree."""
    gradients = choice_settings(None, False).node_gradients
    probe = choosing.backend_probe(built.backend)
    if probe is None:
        return Choices(built.backend_facts["name"], False, segment.stacking, None, {}, {}, gradients)
    situation = _situation(built, probe)
    situation.decided = {"stacking": segment.stacking}  # the products and convolutions of the graph at this degree
    pick = _picker(segment.seed)
    products = {shape.key(): pick(probe.product_implementations(shape)) for shape in situation.product_shapes()}
    engines = {key.key(): pick(probe.convolution_engines(key)[:CONVOLUTION_CANDIDATES])
               for key in situation.convolution_keys()}
    wanted = Choices(probe.device_facts().line(), False, segment.stacking, pick(RECOMPUTE_BUDGETS), engines, products,
                     gradients)
    return take_pinned(situation, wanted, "the ladder's variation")


def _situation(built, probe) -> Situation:
    program = built.program
    return Situation(probe, program.training, program.stackable, program.training.microbatches,
                     choice_settings(None, False).node_gradients, passes=tuple(program.passes.values()))


def _picker(seed: str | None):
    if seed is None:
        return lambda offered: offered[0]
    draw = random.Random(seed)
    return lambda offered: draw.choice(list(offered))
