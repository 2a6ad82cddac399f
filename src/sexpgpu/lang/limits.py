"""The range of every size, count and bound in the language (docs/language.md, "Limits").

`sexpgpu check` enforces each with a range error at the value (the size of a tensor and of a
whole graph with the graph stage's own code and limits, graph/core/emit.py), so that a file it accepts is one a run can carry out: every index fits the
int32 the graphs compute with, every record number and byte offset fits int64, and the work
of checking a file is bounded by a constant times its length.
"""

from __future__ import annotations

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
DIM_MAX = I32_MAX  # a dimension, a layer's width, a vocabulary, :batch, :context: indices are int32
STEPS_MAX = I32_MAX  # :steps, :every, :keep, :warmup: the step is an int32 input of the graphs
MICROBATCHES_MAX = 2**20  # :microbatches, and a pass's :batches
RECORDS_MAX = 2**62  # records a run reads (steps x microbatches x batch), times :context for text
REPEAT_MAX = 100_000  # the count of one (repeat N ...)
CALLS_MAX = 2**18  # graph calls made while building one graph (repeat counts each call)
