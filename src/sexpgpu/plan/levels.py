"""The report's `determinism` and `choices` lines: the run's level (determinism.md, "The
three levels") and why, and what it chose, with the device facts level 2 needs."""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.plan.choices import Choices

CACHE = "~/.cache/sexpgpu"


@dataclass(frozen=True)
class How:
    """How a run came by its choices."""

    mode: str  # one of LINES' keys
    source: str = ""  # the record pinned to, or why a resume chose again
    recorded_device: str = ""  # the device line of the pinned record
    forgets: str = ""  # why the choices made now are not remembered (plan/cache.py); '' when they are


def _own(how: How, device: str) -> str:
    if how.forgets:  # determinism.md, "A run loses level 1"
        return (f"1 within this run only: {how.forgets}, so what it measured is not remembered and another run on "
                "this machine may measure and choose otherwise (3 against this one); 2 pinned to these choices with "
                "--choices")
    return (f"1: this machine repeats these bits with this binary and {CACHE}; another is 3, "
            "or 2 pinned to these choices with --choices")


def _pinned(how: How, device: str) -> str:
    if how.recorded_device == device:
        return (f"2: pinned to the choices of {how.source}, whose device facts read as this machine's: "
                "a run pinned to them repeats its bits here")
    return (f"3: pinned to the choices of {how.source}, recorded on {how.recorded_device}; this machine is "
            f"{device} and may lower otherwise, so the same distribution, not the same bits")


def _rechosen(how: How, device: str) -> str:
    again = (f"{how.forgets}, so what it measured is not remembered and another resume here may choose otherwise"
             if how.forgets else f"this machine repeats the resumed bits with {CACHE} (1)")
    return (f"3: this resume chose again ({how.source}): its choices were made on another machine than the "
            f"steps before it may have been, so the same distribution, not the same bits; {again}")


def _elsewhere(how: How, device: str) -> str:
    return (f"3: {how.source}, so this machine ({device}) chose its own: the same distribution as the values "
            "the run reported inline, not the same bits")


# a mode's line: the text itself where it reads nothing of the run or the machine
LINES = {
    "own": _own,
    "strict": "2: --deterministic: every choice is a fixed rule and nothing is measured, so every --deterministic "
              "run of this file on a machine with these device facts repeats these bits, with no record (and this "
              "machine repeats them: 1)",
    "pinned": _pinned,
    "rechosen": _rechosen,
    "interpreter": "1 on every machine: the CPU interpreter decides nothing from the machine and calls no platform "
                   "math library, so level 1's same bits hold beyond this machine: any machine repeats these bits "
                   "for this file, selection, flags and this sexpgpu",
    "exact": "exact on every device: every sum is exact and rounded once, so its bits are a function of its terms "
             "alone and no machine, stacking degree or GPU count can change them: any device that runs :arithmetic "
             "exact repeats these bits for this file, selection, flags and this sexpgpu, with no record",
    "elsewhere": _elsewhere,
}


def determinism_line(how: How, device: str) -> str:
    line = LINES[how.mode]
    return line if isinstance(line, str) else line(how, device)


@dataclass(frozen=True)
class Spread:
    """How many processes a run spans and how their gradients meet (docs/distributed.md)."""

    processes: int = 1
    nodes: int = 1
    node_gradients: str | None = None
    exact: bool = False
    resumed: bool = False

    def mode(self) -> str:
        if self.processes == 1:
            return "one"
        if self.exact:
            return "exact"
        if self.nodes == 1:
            return "one node"
        if self.node_gradients != "bf16":
            return "f32"
        return "bf16 resumed" if self.resumed else "bf16"


_CARRIED = ("between them as bf16, each node carrying its rounding error into its next step; a checkpoint does not "
            "keep that error")
SPREAD_CLAUSES = {
    "one": "",
    "exact": "; its {processes} processes sum their accumulators exactly, so their number changes no bit",
    "one node": "; its {processes} processes add their gradients in rank order, so the process count is part of these "
                "bits",
    "f32": "; its {processes} processes add their gradients in rank order within each of its {nodes} nodes and in node "
           "order between them, in float32, so the process and node counts are part of these bits, and a resume "
           "repeats them",
    "bf16": "; its {processes} processes add their gradients in rank order within each of its {nodes} nodes and "
            f"{_CARRIED}, so a resume is one step's rounding away from the uninterrupted run",
    "bf16 resumed": "; its {processes} processes add their gradients in rank order within each of its {nodes} nodes "
                    f"and {_CARRIED}: this resume started without it, one step's rounding away from the uninterrupted "
                    "run",
}


def spread_clause(spread: Spread) -> str:
    """What the determinism line adds for a run on several processes."""
    return SPREAD_CLAUSES[spread.mode()].format(processes=spread.processes, nodes=spread.nodes)


def choices_line(choices: Choices) -> str:
    recompute = "no recomputation" if choices.recompute is None else f"recompute {choices.recompute:.2f} flops a byte"
    products = choices.products or {}
    others = sum(1 for name in products.values() if name != "ordinary")
    # none: one node (or a pass, which sends none)
    gradients = f"gradients between nodes {choices.node_gradients}" if choices.node_gradients else \
        "no gradients between nodes"
    text = (f"stacking {choices.stacking}, {recompute}, {len(choices.convolutions)} convolution engines, "
            f"{len(products)} long products ({others} not ordinary), {gradients}")
    text += "; --deterministic" if choices.strict else ""
    return f"{text}; on {choices.device}"
