"""The run loop's small parts: schedules, digests, the metrics log."""

from __future__ import annotations

import json
import math

import numpy as np

from sexpgpu.lang.experiment import ScheduleSpec
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.run.digest import parameters_digest
from sexpgpu.run.metrics import MetricsLog, truncate_after_step
from sexpgpu.run.schedule import learning_rate


def test_constant_and_warmup():
    assert learning_rate(ScheduleSpec("constant"), 0.1, 7, 100) == np.float32(0.1)
    warm = ScheduleSpec("warmup", warmup=10)
    assert learning_rate(warm, 0.1, 5, 100) == np.float32(0.05)
    assert learning_rate(warm, 0.1, 50, 100) == np.float32(0.1)


def test_cosine_matches_a_float64_reference_within_float32_rounding():
    schedule = ScheduleSpec("cosine", warmup=10, min_lr=0.001)
    for step in range(1, 101):
        ours = float(learning_rate(schedule, 0.01, step, 100))
        if step <= 10:
            reference = 0.01 * step / 10
        else:
            progress = (step - 10) / 90
            reference = 0.001 + 0.5 * (0.01 - 0.001) * (1 + math.cos(math.pi * progress))
        # The cosine's argument is rounded to float32 first: an error of about 1e-7 of the peak rate.
        assert abs(ours - reference) <= 1e-7 * 0.01 + 6e-8 * reference
    assert float(learning_rate(schedule, 0.01, 100, 100)) == np.float32(0.001)


def test_digest_changes_with_any_bit_and_ignores_dict_order():
    cpu = Interpreter()
    a = {"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32)}
    b = {"b": a["b"].copy(), "w": a["w"].copy()}
    assert parameters_digest(cpu, a) == parameters_digest(cpu, b)
    flipped = a["w"].copy()
    flipped.view(np.uint32)[0, 0] ^= 1
    assert parameters_digest(cpu, {"w": flipped, "b": a["b"]}) != parameters_digest(cpu, a)
    assert parameters_digest(cpu, {"w": a["w"].reshape(4), "b": a["b"]}) != parameters_digest(cpu, a)


def test_truncate_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(str(path))
    for step in range(1, 6):
        log.write({"step": step, "loss": 1.0 / step})
    log.close()
    with open(path, "a") as handle:
        handle.write('{"step": 6, "lo')
    truncate_after_step(str(path), 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
