"""The det-train demonstration, a few steps of it, on the CPU."""

import importlib.util
import sys
from pathlib import Path

import torch

DEMO = Path(__file__).resolve().parents[2] / "examples" / "det_train_demo.py"


def load_demo():
    spec = importlib.util.spec_from_file_location("det_train_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_det_linear_runs_are_identical_unsharded_and_k_sharded():
    demo = load_demo()
    shape = demo.Shape(batch=8, inputs=24, hidden=20, outputs=4)
    result = demo.run_demo(steps=4, device="cpu", shape=shape)
    exact = result["DetLinear"]
    assert exact["loss_differences"] == [0.0] * 4
    assert exact["loss_differences_fp64"] == [0.0] * 4
    unsharded, sharded = exact["weights"]
    assert unsharded.numpy().tobytes() == sharded.numpy().tobytes()
    initial = torch.cat([p.reshape(-1) for p in demo.initial_parameters(shape, "cpu")])
    assert not torch.equal(unsharded, initial)  # it trained
    assert "identical bytes: True" in demo.describe("DetLinear", exact)
