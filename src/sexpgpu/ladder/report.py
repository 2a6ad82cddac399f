"""The ladder's report (docs/ladder.md, "The report"): `report.md` and `report.json` in the
ladder's directory, and a plot for each tier, `<tier>.png` beside them: its loss curves
against its envelope, and the relative difference of runs on a log scale. The plots need
matplotlib (tools/plotting.py); without it the report says so and is written all the same."""

from __future__ import annotations

import json
import os
import time

import numpy as np

import sexpgpu
from sexpgpu.files import write_atomically
from sexpgpu.tools.plotting import FLOOR, optional_pyplot, relative_difference

REPORT = "report.md"
RECORD = "report.json"
SIZE_INCHES = (9.0, 7.5)
DPI = 100
SOURCE_COLOUR = "0.6"


def write_report(result) -> None:
    pyplot = optional_pyplot()
    plots = {tier.tier.name: _plot(pyplot, tier, result.directory) for tier in result.tiers} if pyplot else {}
    result.plots_note = "" if pyplot else "no plots: matplotlib is not installed (pip install 'sexpgpu[plot]')"
    result.report = os.path.join(result.directory, REPORT)
    write_atomically(result.report, markdown(result, plots))
    write_atomically(os.path.join(result.directory, RECORD), json.dumps(record(result), indent=2) + "\n")


def record(result) -> dict:
    return {"command": result.command, "device": result.device, "sexpgpu": sexpgpu.__version__,
            "seconds": round(result.seconds, 1), "cpu_seconds": round(result.cpu_seconds, 1), "failed": result.failed,
            "tiers": [{"name": tier.tier.name, "seconds": round(tier.seconds, 1),
                       "rows": [{"row": promise.row, "promised": promise.promised, "measured": outcome.measured,
                                 "verdict": outcome.verdict} for promise, outcome in tier.rows]}
                      for tier in result.tiers]}


def markdown(result, plots: dict) -> str:
    lines = ["# Ladder report", "",
             f"`{result.command}` on {result.device}, sexpgpu {sexpgpu.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {result.counts()} in {result.seconds:.0f} s "
             f"({result.cpu_seconds:.0f} s of CPU time).", ""]
    if result.plots_note:
        lines += [result.plots_note + ".", ""]
    for tier in result.tiers:
        lines += _tier_section(tier, plots.get(tier.tier.name))
    return "\n".join(lines)


def _tier_section(result, plot: str | None) -> list:
    tier, envelope, run = result.tier, result.envelope, result.workspace.experiment.run
    kind = "Chaotic" if tier.chaotic else "Stable"
    lines = [f"## {tier.name}", "",
             f"{tier.purpose} {kind}; {run.steps} steps of {run.microbatches} microbatches of {run.batch}; "
             f"{result.seconds:.0f} s here.", "",
             f"Envelope: {len(envelope.sources)} runs on {'; '.join(envelope.devices())}: "
             f"{'; '.join(source.variation for source in envelope.sources)}. Its band: {envelope.margin.describe()}.", "",
             "| row | promised | measured | verdict |", "|---|---|---|---|"]
    lines += [f"| {_cell(promise.row)} | {_cell(promise.promised)} | {_cell(outcome.measured)} | {outcome.verdict} |"
              for promise, outcome in result.rows]
    if plot:
        lines += ["", f"![{tier.name}: the loss against its envelope, and the relative difference of runs]({plot})"]
    return lines + [""]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- the plot ------------------------------------------------------------------------------

def _plot(pyplot, result, directory: str) -> str:
    """`<tier>.png`: the curves against the envelope above, their relative differences below."""
    envelope, workspace = result.envelope, result.workspace
    steps = np.arange(1, envelope.steps + 1)
    curves = {label: curve for label, curve in (
        ("run a", _curve(workspace, "a")),
        ("run b (level 1)", _curve(workspace, "a", "b")),
        ("level 3: a resumed choosing again", _curve(workspace, "a", "rechosen")),
    ) if curve is not None and len(curve) == envelope.steps}
    figure, (above, below) = pyplot.subplots(2, 1, figsize=SIZE_INCHES, sharex=True)
    low, high, least, most = envelope.band()
    # a log scale draws no band below 0, where the margin can reach below a loss near 0
    bottom = np.maximum(low, least[least > 0].min() / 2 if (least > 0).any() else FLOOR)
    above.fill_between(steps, bottom, high, color="0.88", label=f"envelope of {len(envelope.sources)} runs")
    for source in envelope.sources:
        above.plot(steps, source.loss, color=SOURCE_COLOUR, linewidth=0.6)
    first = envelope.sources[0]
    for source in envelope.sources[1:]:
        below.semilogy(steps, relative_difference(source.loss, first.loss), color=SOURCE_COLOUR, linewidth=0.6)
    for index, (label, curve) in enumerate(curves.items()):
        above.plot(steps, curve, color=f"C{index}", linewidth=1.0, linestyle="-" if index == 0 else "--", label=label)
        if index:
            below.semilogy(steps, relative_difference(curve, curves["run a"]), color=f"C{index}", label=f"{label} vs run a")
    above.set_yscale("log")
    above.set_ylabel("loss")
    above.set_title(f"{result.tier.name} on {workspace.device}: the loss against its envelope")
    above.legend(fontsize="small")
    below.plot([], [], color=SOURCE_COLOUR, label=f"each envelope run vs {first.variation} ({first.kind})")
    # what a run may differ by before it leaves the band: the margin, relative to the loss
    below.semilogy(steps, relative_difference(high, most), color="black", linestyle=":", linewidth=1.0,
                   label="the band's margin beyond the runs' range")
    below.set_ylim(bottom=FLOOR / 10)
    below.set_ylabel("|a - b| / max(|a|, |b|)")
    below.set_xlabel("step")
    below.legend(fontsize="small")
    figure.tight_layout()
    name = f"{result.tier.name}.png"
    try:
        figure.savefig(os.path.join(directory, name), dpi=DPI)
    finally:
        pyplot.close(figure)
    return name


def _curve(workspace, *names: str):
    """The runs' loss curve when the ladder made them all, else None: a plot never runs."""
    return workspace.loss_curve(*names) if all(name in workspace.made for name in names) else None
