"""A resume refuses a checkpoint whose experiment differs in anything that changes bits."""

from __future__ import annotations

import copy

import pytest

from store_samples import sample_record
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import BIT_KEYS, check_same_experiment


def test_the_same_experiment_passes_whatever_else_moved():
    current = sample_record(10)
    checkpoint = sample_record(3)  # another step and data position: what a resume restores
    checkpoint["microbatches"] = 4  # the run loop refuses layout changes with its own error
    checkpoint["experiment"]["file"] = "/old/place/tiny.sexp"
    check_same_experiment(checkpoint, current)


def test_tuples_and_lists_compare_as_json_writes_them():
    current = sample_record(1)
    current["experiment"]["resolved"]["shape"] = (3, 4)
    checkpoint = copy.deepcopy(current)
    checkpoint["experiment"]["resolved"]["shape"] = [3, 4]
    check_same_experiment(checkpoint, current)


@pytest.mark.parametrize("change, shown", [
    (lambda r: r["experiment"]["resolved"].update(seed=8), "experiment.resolved.seed: checkpoint 7, now 8"),
    (lambda r: r.update(selection="big"), 'selection: checkpoint "tiny", now "big"'),
    (lambda r: r["flags"].pop("deterministic"), "flags.deterministic: checkpoint true, now (absent)"),
    (lambda r: r["environment"].update(SEXPGPU_OPTIMIZE="0"), 'environment.SEXPGPU_OPTIMIZE: checkpoint (absent), now "0"'),
    (lambda r: r.update(world_size=2), "world_size: checkpoint 1, now 2"),
    (lambda r: r["experiment"]["resolved"].update(batch=4.0), "experiment.resolved.batch: checkpoint 4, now 4.0"),
])
def test_each_bit_changing_difference_is_E_CKPT_002_and_shown(change, shown):
    current = sample_record(1)
    change(current)
    with pytest.raises(SexpgpuError) as caught:
        check_same_experiment(sample_record(1), current)
    assert caught.value.code == "E-CKPT-002" and shown in caught.value.message


def test_many_differences_are_summarised():
    current = sample_record(1)
    current["experiment"]["resolved"] = {f"k{i}": i for i in range(20)}
    with pytest.raises(SexpgpuError, match="and 10 more"):
        check_same_experiment(sample_record(1), current)


def test_the_caller_chooses_the_keys():
    current = sample_record(1)
    current["world_size"] = 8
    check_same_experiment(sample_record(1), current, bit_keys=[k for k in BIT_KEYS if k != "world_size"])
