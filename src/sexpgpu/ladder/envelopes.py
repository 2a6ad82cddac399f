"""A tier's envelope (docs/ladder.md, "Envelopes"): the per-step band its loss curve stays
in under the changes level 3 allows, measured from runs and kept as data in
`ladder/envelopes/<tier>.json`.

The band at step s is the sources' range there, [min, max], widened on each side by
    MARGIN.spread * (the widest range within MARGIN.window steps of s) + MARGIN.relative * |loss|.
The window's term is the chaos: the range of a handful of runs at one step can be narrow by
chance where its neighbours show how far curves go. The relative term is rounding: a run on
another device differs in the last bits from its first step, where every source of one
device may still agree bit for bit. A level-3 run must stay inside the band at every step.

Each source records its device, its variation (the choices, segment by segment) and its
curve, so the band is a function of the sources: a regeneration on another device adds that
device's sources and keeps the others' (`regenerate`)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import numpy as np

import sexpgpu
from sexpgpu.errors import SexpgpuError
from sexpgpu.files import write_atomically
from sexpgpu.run.checkpointing import bit_identity, identity_digest
from sexpgpu.ladder.variations import compute, envelope_variations
from sexpgpu.run.setup import build_run

FORMAT = 1
MIN_SOURCES = 5  # fewer runs make no band worth the name


@dataclass(frozen=True)
class Margin:
    spread: float = 1.0  # times the widest range of the sources within `window` steps
    window: int = 10
    relative: float = 1e-4  # of the loss: a thousand times the CPU's and a GPU's losses apart on tiny-adam

    def widened(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """The margin at each step."""
        spread = high - low
        widest = np.array([spread[max(0, step - self.window):step + self.window + 1].max() for step in range(len(spread))])
        return self.spread * widest + self.relative * np.maximum(np.abs(low), np.abs(high))

    def describe(self) -> str:
        return (f"the sources' range widened by {self.spread:g} times the widest range within {self.window} steps "
                f"and {self.relative:g} of the loss")


MARGIN = Margin()
# A chaotic tier's curves part by more than a handful of runs show at any one step: on the
# H200 one of spirals-chaotic's sixteen sources lay 4.8 margins outside the others' band under
# MARGIN, and inside it with this one (the widest range over 25 steps either side, 5 times).
CHAOTIC_MARGIN = Margin(spread=5.0, window=25)


def margin_of(tier) -> Margin:
    return CHAOTIC_MARGIN if tier.chaotic else MARGIN


@dataclass(frozen=True)
class Source:
    device: str  # the device's line (plan/device.py), or the CPU interpreter's name
    kind: str  # cpu or cuda
    variation: str
    segments: list  # {"from": step, "choices": ...} of each segment
    sexpgpu: str
    loss: list  # each step's loss


@dataclass(frozen=True)
class Containment:
    """How a curve lies in an envelope."""

    steps: int
    outside: list  # the steps (from 1) where the curve is outside the band
    furthest: float  # the largest distance beyond the sources' range, in margins: above 1 is outside
    furthest_step: int
    mismatch: str = ""  # why the curve cannot lie in the envelope at all

    @property
    def inside(self) -> bool:
        return not self.outside

    def describe(self) -> str:
        if self.mismatch:
            return f"outside: {self.mismatch}"
        if self.inside and self.furthest == 0:
            return f"inside at all {self.steps} steps, within the sources' own range at each"
        if self.inside:
            return (f"inside at all {self.steps} steps; furthest out at step {self.furthest_step}, "
                    f"{self.furthest:.2f} of the margin beyond the sources' range")
        return f"outside at {len(self.outside)} of {self.steps} steps, first at step {self.outside[0]}"


@dataclass(frozen=True)
class Envelope:
    tier: str
    digest: str  # the tier's bit identity (checkpointing.py) and microbatches: what made the sources
    steps: int
    margin: Margin
    sources: tuple

    @property
    def curves(self) -> np.ndarray:
        return np.array([source.loss for source in self.sources], dtype=np.float64)

    def band(self) -> tuple:
        """(low, high, the sources' min, max) at each step."""
        curves = self.curves
        low, high = curves.min(axis=0), curves.max(axis=0)
        margin = self.margin.widened(low, high)
        return low - margin, high + margin, low, high

    def check(self, loss) -> Containment:
        loss = np.asarray(loss, dtype=np.float64)
        if loss.shape != (self.steps,):
            return Containment(len(loss), list(range(1, self.steps + 1)), float("inf"), 1,
                               f"the curve has {len(loss)} steps and the envelope {self.steps}")
        low, high, least, most = self.band()
        margin = np.maximum(high - most, np.finfo(np.float64).tiny)  # 0 only where the loss is 0
        beyond = np.maximum(loss - most, least - loss).clip(min=0) / margin
        beyond = np.where(np.isfinite(loss), beyond, np.inf)  # a NaN loss is outside everything
        furthest = int(np.argmax(beyond))
        return Containment(self.steps, [int(step) + 1 for step in np.flatnonzero(beyond > 1)], float(beyond[furthest]),
                           furthest + 1)

    def devices(self) -> list:
        return list(dict.fromkeys(source.device for source in self.sources))

    def to_json(self) -> dict:
        low, high, least, most = self.band()
        return {"format": FORMAT, "tier": self.tier, "digest": self.digest, "steps": self.steps,
                "margin": asdict(self.margin), "regenerate": f"sexpgpu ladder --envelopes {self.tier} --device DEVICE",
                "band": {"low": low.tolist(), "high": high.tolist(), "min": least.tolist(), "max": most.tolist()},
                "sources": [asdict(source) for source in self.sources]}


def outside_peers(envelope: Envelope) -> list:
    """The sources that lie outside the envelope of the others: each should be inside, as a
    level-3 run must be, or the margin is too narrow for the tier."""
    return [source.variation for index, source in enumerate(envelope.sources)
            if not Envelope(envelope.tier, envelope.digest, envelope.steps, envelope.margin,
                            envelope.sources[:index] + envelope.sources[index + 1:]).check(source.loss).inside]


def tier_digest(built) -> str:
    """What an envelope is of: the tier's bit identity and its microbatches (which decide the
    stacking degrees a machine can choose)."""
    identity = {"identity": bit_identity(built.experiment, built.data_identity),
                "microbatches": built.experiment.run.microbatches}
    return identity_digest(identity)


def read_envelope(tier, digest: str | None = None) -> Envelope:
    """The tier's envelope; E-LADDER-004 when it is missing, not an envelope, or was made from
    another version of the tier's file (when `digest` is given)."""
    path = tier.envelope_file
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
        envelope = _envelope(content)
    except FileNotFoundError:
        raise _envelope_error(tier, f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise _envelope_error(tier, f"{path} is not an envelope ({type(error).__name__}: {error})") from None
    if digest is not None and envelope.digest != digest:
        raise _envelope_error(tier, f"{path} was made from another version of {tier.file}")
    if envelope.to_json()["band"] != content["band"]:
        raise _envelope_error(tier, f"{path}'s band is not the one its sources and margin make")
    return envelope


def _envelope(content: dict) -> Envelope:
    if content.get("format") != FORMAT:
        raise ValueError(f"format {content.get('format')!r}, expected {FORMAT}")
    sources = tuple(Source(**source) for source in content["sources"])
    steps = int(content["steps"])
    if len(sources) < MIN_SOURCES or any(len(source.loss) != steps for source in sources):
        raise ValueError(f"it needs at least {MIN_SOURCES} sources of {steps} steps each")
    return Envelope(content["tier"], content["digest"], steps, Margin(**content["margin"]), sources)


def _envelope_error(tier, why: str) -> SexpgpuError:
    return SexpgpuError("E-LADDER-004", f"the tier {tier.name} has no envelope to check level 3 against: {why}.",
                        hint=f"Make it again with: sexpgpu ladder --envelopes {tier.name} --device DEVICE "
                             "(docs/ladder.md, \"Envelopes\").")


def regenerate(tier, device: str, say=print) -> Envelope:
    """The tier's envelope measured again on this device: a source for each of its variations
    here, beside the sources of other devices already recorded for this version of the file."""
    experiment = tier.experiment()
    built = build_run(experiment, device)
    digest, here = tier_digest(built), built.backend_facts["name"]
    kept = [source for source in _recorded_sources(tier, digest, say) if source.device != here]
    variations = envelope_variations(tier.name, built)
    if len(kept) + len(variations) < MIN_SOURCES:
        raise SexpgpuError("E-LADDER-006", f"the tier {tier.name} offers {len(variations)} variations on {here}, and an "
                                           f"envelope needs at least {MIN_SOURCES} runs.",
                           hint="Give the tier more :microbatches (more stacking degrees), or regenerate on a device "
                                "that makes choices.")
    sources = []
    for variation in variations:
        computed = compute(experiment, device, variation)
        sources.append(Source(here, built.backend_facts["kind"], variation.name, computed.segments, sexpgpu.__version__,
                              computed.loss))
        say(f"  {tier.name:<18}{variation.name}: final loss {computed.loss[-1]:.6g}")
    envelope = Envelope(tier.name, digest, experiment.run.steps, margin_of(tier), tuple(kept + sources))
    write_envelope(tier.envelope_file, envelope)
    return envelope


def _recorded_sources(tier, digest: str, say) -> list:
    """The sources already recorded for this version of the tier: none when there is no
    envelope yet, it cannot be read, or it was made from another version."""
    if not os.path.exists(tier.envelope_file):
        return []
    try:
        envelope = read_envelope(tier, digest)
    except SexpgpuError as error:
        say(f"  {tier.name:<18}starting afresh: {error.message}")
        return []
    return list(envelope.sources)


def write_envelope(path: str, envelope: Envelope) -> None:
    """Whole, through a temporary file renamed over the old one."""
    write_atomically(path, _text(envelope.to_json()))


def _text(content: dict) -> str:
    """The envelope as JSON that a reader can scan: a line for each entry, each band and each
    source."""
    entries = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in content.items() if key not in ("band", "sources")]
    bands = ",\n".join(f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in content["band"].items())
    sources = ",\n".join(f"  {json.dumps(source, sort_keys=True)}" for source in content["sources"])
    return "{\n" + ",\n".join(entries + [f' "band": {{\n{bands}\n }}', f' "sources": [\n{sources}\n ]']) + "\n}\n"
