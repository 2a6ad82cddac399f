"""The gradients' rounding under `:arithmetic exact`, captured as a CUDA graph from its second call.

A captured microbatch graph returns its gradients as pending sums over its own buffers, which
stay where they are from call to call (runtime.py's Captured). Rounding them (the rounding
graph of graph/passes/exact_region.py's GradientSums, which the backend runs here) launches the same kernels over the same memory every step: several hundred launches for
gpt-50m, whose phase took 58 to 92 ms eagerly when timed alone on an H200 and 44 ms replayed
(a whole step did not move, 197 to 200 ms: the host queued the eager launches while the
microbatch's kernels still ran, so the step was bound by the GPU either way; the replay
frees the host). So the second time the same sums come (the same names, each from the same
captured graph, each over that graph's buffers as they lie: `PendingSum.origin`, set by the
backend), the rounding is captured, and from then on replayed; each call gets copies of the
graph's results. The first call compiles and warms up. Sums from anywhere else (an eager
call, a copy made at the step, digits already formed, several calls added), and a rounding
that would wait for the device (found in the warm-up, under the sync debug mode), are
rounded eagerly. The bits are the eager rounding's: the same kernels on the same values.
"""

from __future__ import annotations

from sexpgpu.backends.cuda.runtime import waits_refused
from sexpgpu.backends.exact_sums import PendingSum, rounded_once

EAGER = None  # a signature whose rounding is not captured


def signature(total: dict):
    """What makes two roundings the same kernels over the same memory: each gradient's name
    and its sum's origin; None where some gradient has no origin or its digits are formed."""
    keyed = []
    for name in sorted(total):
        value = total[name]
        if not isinstance(value, PendingSum) or value.origin is None or value.formed:
            return None
        keyed.append((name, value.origin))
    return tuple(keyed)


def rounded_eagerly(total: dict) -> dict:
    """Each acc value rounded once into float32, where it lies."""
    return {name: rounded_once(value) for name, value in total.items()}


class CapturedSums:
    """The rounding of a step's gradients, replaying a CUDA graph for a captured graph's pending sums."""

    def __init__(self, device):
        self.device = device
        self.seen: dict = {}  # signature -> calls so far, until captured
        self.graphs: dict = {}  # signature -> (CUDAGraph, its outputs) or EAGER

    def rounded(self, total: dict) -> dict:
        key = signature(total)
        if key is None:
            return rounded_eagerly(total)
        if key not in self.graphs:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] < 2:
                return rounded_eagerly(total)
            self.graphs[key] = self._captured(total)
        recorded = self.graphs[key]
        if recorded is EAGER:
            return rounded_eagerly(total)
        graph, outputs = recorded
        graph.replay()
        return {name: tensor.clone() for name, tensor in outputs.items()}

    def is_captured(self) -> bool:
        """Whether some rounding replays a CUDA graph."""
        return any(recorded is not EAGER for recorded in self.graphs.values())

    def release(self) -> None:
        """Let go of every captured rounding (the graphs whose buffers they read are let go)."""
        self.seen.clear()
        self.graphs.clear()

    def _captured(self, total: dict):
        """(graph, outputs) of the rounding of `total`, or EAGER where it waits for the device."""
        import torch

        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream):  # warm-up on the capture stream, as PyTorch asks
                with waits_refused(torch):
                    rounded_eagerly(total)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                outputs = rounded_eagerly(total)
        except RuntimeError:  # a read back: PyTorch refuses it in the warm-up or in the capture
            torch.cuda.synchronize(self.device)
            return EAGER
        return graph, outputs
