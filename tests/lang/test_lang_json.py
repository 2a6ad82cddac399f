"""The resolved experiment as JSON: plain, stable, and only what the selected run uses."""

from __future__ import annotations

import json

from sexpgpu.lang.forms import load_experiment
from sexpgpu.lang.serialize import experiment_to_json

TEXT = """; a comment
(defgraph block (x) :width 8
  (add x (linear x :out width :as fc)))
(defgraph unused (x) (relu x))
(defgraph net (x) :layers 2
  (let h (repeat layers block x :as block))   ; calls block
  (linear h :out 1 :as head))
(defgraph weighted (out y) :weight 2.0
  (mul weight (mse out y)))
(defgenerator points :width 8
  (let x (normal (batch width) :salt :step))
  (record :x x :y (sum x :axis 1 :keep true)))
(defrun fit
  :seed 18446744073709551615
  :data (generator points)
  :model (net x :layers 3)
  :loss (weighted y)
  :optimizer (adamw :lr 0.001)
  :schedule (cosine :warmup 2)
  :batch 8
  :microbatches 2
  :steps 10
  :passes ((eval :every 5 :name held :batches 2))
  :checkpoint (every 5 :keep 1))
(defrun other
  :seed 1 :data (text pydoc :context 4) :model (unused x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 3)
"""


def load(tmp_path, text=TEXT, selection="fit"):
    path = tmp_path / "exp.sexp"
    path.write_text(text)
    return load_experiment(str(path), selection)


def test_resolved_run(tmp_path):
    experiment = load(tmp_path)
    resolved = experiment_to_json(experiment)
    assert list(resolved) == ["format", "path", "source_sha256", "selection", "run", "graphs"]
    assert resolved["selection"] == "fit" and resolved["source_sha256"] == experiment.source_sha256
    run = resolved["run"]
    assert list(run) == ["name", "seed", "data", "model", "loss", "optimizer", "schedule", "batch", "microbatches", "precision",
                         "steps", "passes", "checkpoint"]
    assert run["seed"] == 2**64 - 1
    assert run["data"] == {"kind": "generator", "generator": {"graph": "points", "fields": [], "options": {"width": 8}}}
    assert run["model"] == {"graph": "net", "fields": ["x"], "options": {"layers": 3}}
    assert run["loss"] == {"kind": "graph", "fields": ["y"],
                           "graph": {"graph": "weighted", "fields": ["y"], "options": {"weight": 2.0}}}
    assert run["optimizer"] == {"kind": "adamw", "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                "weight-decay": 0.01, "clip": "inf"}
    assert run["schedule"] == {"kind": "cosine", "warmup": 2, "min-lr": 0.0}
    assert run["passes"] == [{"kind": "eval", "name": "held", "every": 5, "batches": 2, "data": None}]
    assert run["checkpoint"] == {"every": 5, "keep": 1, "to": None}


def test_graphs_are_the_ones_the_run_reaches_with_canonical_bodies(tmp_path):
    graphs = experiment_to_json(load(tmp_path))["graphs"]
    assert list(graphs) == ["block", "net", "points", "weighted"]  # not `unused`; `block` through `net`
    assert graphs["net"] == {
        "kind": "defgraph", "inputs": ["x"], "options": {"layers": 2},
        "body": ["(let h (repeat layers block x :as block))", "(linear h :out 1 :as head)"],
    }
    assert graphs["points"]["kind"] == "defgenerator" and graphs["points"]["inputs"] == []


def test_is_plain_json_and_stable(tmp_path):
    first = json.dumps(experiment_to_json(load(tmp_path)), allow_nan=False)
    second = json.dumps(experiment_to_json(load(tmp_path)), allow_nan=False)
    assert first == second and json.loads(first)["run"]["name"] == "fit"


def test_comments_and_spacing_change_only_the_digest(tmp_path):
    before = experiment_to_json(load(tmp_path))
    edited = TEXT.replace("; a comment", "; another comment\n\n").replace("(add x (linear", "(add   x\n  (linear")
    after = experiment_to_json(load(tmp_path, edited))
    assert after["source_sha256"] != before["source_sha256"]
    after["source_sha256"] = before["source_sha256"]
    assert after == before


def test_other_selection(tmp_path):
    resolved = experiment_to_json(load(tmp_path, selection="other"))
    assert list(resolved["graphs"]) == ["unused"]
    assert resolved["run"]["data"] == {"kind": "text", "corpus": "pydoc", "context": 4}
    assert resolved["run"]["optimizer"] == {"kind": "sgd", "lr": 0.1, "clip": "inf"}
    assert resolved["run"]["checkpoint"] is None and resolved["run"]["passes"] == []
