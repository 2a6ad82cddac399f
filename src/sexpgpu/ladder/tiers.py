"""The ladder's tiers (docs/ladder.md): the reference experiments, from tiny to as large as one
GPU trains in a few minutes. A ladder folder's `tiers.json` lists them, in order, each with
what it is for; a tier named N is the experiment `N.sexp` there, and its envelope is
`envelopes/N.json` (ladder/envelopes.py). The reference ladder is package data, REFERENCE
(`reference/` beside this file, with the data its tiers read), so `sexpgpu ladder` finds it
from any directory after `pip install`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.forms import load_experiment

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")
MANIFEST = "tiers.json"
FORMAT = 1
DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True)
class Tier:
    name: str
    purpose: str  # what the tier is for, as the report says it
    chaotic: bool  # rounding differences grow until the curves part
    devices: tuple  # the device kinds the full ladder runs it on
    quick: bool  # one of `--quick`'s tiers
    exact_steps: int  # how many steps the exact-mode rows compute
    folder: str  # the ladder folder

    @property
    def file(self) -> str:
        return os.path.join(self.folder, f"{self.name}.sexp")

    @property
    def envelope_file(self) -> str:
        return os.path.join(self.folder, "envelopes", f"{self.name}.json")

    def experiment(self):
        return load_experiment(self.file)


def _is_kinds(value) -> bool:
    return isinstance(value, list) and bool(value) and all(kind in DEVICE_KINDS for kind in value)


# Each field of a tier in tiers.json: (a test of its value, what it must be).
FIELDS = {
    "name": (lambda value: isinstance(value, str) and value.replace("-", "").isalnum(), "a name of letters, digits and -"),
    "purpose": (lambda value: isinstance(value, str) and bool(value.strip()), "a sentence"),
    "chaotic": (lambda value: isinstance(value, bool), "true or false"),
    "devices": (_is_kinds, f"a list of device kinds ({', '.join(DEVICE_KINDS)})"),
    "quick": (lambda value: isinstance(value, bool), "true or false"),
    "exact_steps": (lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                    "an integer from 1"),
}


def read_tiers(folder: str) -> list:
    """Every tier of the ladder folder, in the manifest's order; E-LADDER-001 when there is no
    ladder there or its manifest is not one."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        raise SexpgpuError("E-LADDER-001", f"{folder} holds no ladder: there is no {path}.",
                           hint="Name a folder that holds a ladder's tiers.json with --ladder DIR, or leave out --ladder for "
                                "the reference ladder that comes with sexpgpu.") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _not_a_manifest(path, f"it cannot be read as JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("tiers"), list):
        raise _not_a_manifest(path, f'it is not {{"format": {FORMAT}, "tiers": [...]}}')
    return [_tier(path, folder, index, entry) for index, entry in enumerate(manifest["tiers"])]


def _tier(path: str, folder: str, index: int, entry) -> Tier:
    if not isinstance(entry, dict) or set(entry) != set(FIELDS):
        raise _not_a_manifest(path, f"tier {index + 1} does not have exactly the fields {', '.join(FIELDS)}")
    for key, (valid, expected) in FIELDS.items():
        if not valid(entry[key]):
            raise _not_a_manifest(path, f"tier {index + 1}'s {key} is not {expected}")
    return Tier(entry["name"], entry["purpose"], entry["chaotic"], tuple(entry["devices"]), entry["quick"],
                entry["exact_steps"], folder)


def _not_a_manifest(path: str, why: str) -> SexpgpuError:
    return SexpgpuError("E-LADDER-001", f"{path} is not a ladder's list of tiers: {why}.",
                        hint="See docs/ladder.md, \"Tiers\", for its fields.")


def select_tiers(tiers: list, names, kind: str, quick: bool) -> list:
    """The tiers a ladder runs on a device of this kind: those named (E-LADDER-002 for a name
    that is none, E-LADDER-003 for one that does not run on this kind), else every tier that
    runs on it, or with `quick` its quick ones."""
    by_name = {tier.name: tier for tier in tiers}
    for name in names:
        if name not in by_name:
            raise SexpgpuError("E-LADDER-002", f"the ladder has no tier '{name}': its tiers are {', '.join(by_name)}.",
                               hint=did_you_mean(name, by_name))
        if kind not in by_name[name].devices:
            raise SexpgpuError("E-LADDER-003", f"the tier {name} runs on {', '.join(by_name[name].devices)}, and this "
                                               f"ladder runs on {kind}.",
                               hint="Choose the device with --device, or leave the tier out.")
    chosen = [by_name[name] for name in dict.fromkeys(names)] if names else [tier for tier in tiers if kind in tier.devices]
    return [tier for tier in chosen if tier.quick] if quick and not names else chosen
