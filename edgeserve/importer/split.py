"""`--split-at`: cut one ONNX graph into consecutive stages at named intermediate tensors.

Stage k holds the nodes needed for split tensor k+1 that no earlier stage holds (the last stage: the
nodes needed for the model's outputs). A stage takes every tensor its nodes consume that it does not
compute (model inputs, or tensors an earlier stage gives) and gives every tensor it computes that a
later stage consumes: the split tensor, and any other tensor that crosses the cut (a skip
connection). The graphs are cut by onnx's own `onnx.utils.Extractor`.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.errors import RepositoryError

# Chaining the stages must reproduce the whole graph's float outputs within
# RTOL * max(1, max |whole output|) (ONNX Runtime fuses the cut graphs differently: last bits differ).
RTOL = 1e-4


@dataclass(frozen=True)
class StagePlan:
    index: int
    nodes: tuple[int, ...]  # indices into graph.node, in graph order
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def node_inputs(node: Any) -> list[str]:
    """What a node reads, including outer-scope names its subgraphs (If/Loop/Scan bodies) read."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {n for sub in graph.node for n in sub.output} | {i.name for i in graph.input}
            inner |= {i.name for i in graph.initializer}
            for sub in graph.node:
                names += [n for n in node_inputs(sub) if n not in inner]
    return names


class Graph:
    """Producer and consumer indices of one graph's tensors."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.initializers = {t.name for t in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.outputs = [o.name for o in graph.output]
        self.producer: dict[str, int] = {}
        self.reads: list[list[str]] = []
        for index, node in enumerate(graph.node):
            for name in node.output:
                if name:
                    self.producer[name] = index
            self.reads.append(node_inputs(node))

    def ancestors(self, names: Iterable[str]) -> set[int]:
        """Indices of the nodes needed to compute `names` from the inputs."""
        seen: set[int] = set()
        stack = list(names)
        while stack:
            index = self.producer.get(stack.pop())
            if index is not None and index not in seen:
                seen.add(index)
                stack += self.reads[index]
        return seen

    def check_tensor(self, name: str) -> None:
        if name in self.producer:
            return
        if name in self.inputs or name in self.initializers:
            what = "a model input" if name in self.inputs else "a weight (initializer)"
            raise RepositoryError(
                f"--split-at {name}: {name!r} is {what}, not a tensor a node computes: split at an "
                "intermediate tensor (`edgeserve import FILE --list-tensors` lists them)"
            )
        close = difflib.get_close_matches(name, [*self.producer], n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise RepositoryError(
            f"--split-at {name}: the graph has no tensor {name!r}; {hint}"
            "`edgeserve import FILE --list-tensors` lists the tensors to split at"
        )


def plan(graph_proto: Any, split_at: Sequence[str]) -> list[StagePlan]:
    """The stages of a cut at `split_at`, in order; RepositoryError for a name or order that cannot cut."""
    g = Graph(graph_proto)
    for name in split_at:
        g.check_tensor(name)
    if len(set(split_at)) != len(split_at):
        raise RepositoryError(f"--split-at {','.join(split_at)}: a tensor is named twice; name each once")
    needed = g.ancestors(g.outputs)
    for name in split_at:
        if g.producer[name] not in needed:
            raise RepositoryError(
                f"--split-at {name}: no model output depends on {name!r}, so cutting there splits nothing: "
                "choose a tensor on the path to the outputs (`--list-tensors`)"
            )
    for before, after in itertools.pairwise(split_at):
        if g.producer[before] in g.ancestors([after]):
            continue
        if g.producer[after] in g.ancestors([before]):
            raise RepositoryError(
                f"--split-at {','.join(split_at)}: {after!r} is computed before {before!r}: "
                "name the split tensors in the order the graph computes them"
            )
        raise RepositoryError(
            f"--split-at {','.join(split_at)}: {after!r} does not depend on {before!r} (they are on "
            "parallel branches): stages are consecutive, so each split tensor must be computed from the "
            "one before it"
        )
    done: set[int] = set()
    groups: list[set[int]] = []
    for targets in [*([t] for t in split_at), g.outputs]:
        nodes = g.ancestors(targets) - done
        if not nodes:
            raise RepositoryError(
                f"--split-at {','.join(split_at)}: stage {len(groups)} would hold no node: "
                "drop a split tensor"
            )
        groups.append(nodes)
        done |= nodes
    for name in g.outputs:
        stage = next((k for k, nodes in enumerate(groups) if g.producer.get(name) in nodes), None)
        if stage is not None and stage < len(groups) - 1:
            raise RepositoryError(
                f"--split-at {','.join(split_at)}: the model output {name!r} is computed in stage {stage}, "
                "before the last cut: split after it (only the last stage gives the model's outputs)"
            )
    produced = [{n for i in nodes for n in g.graph.node[i].output if n} for nodes in groups]
    consumed = [{n for i in nodes for n in g.reads[i]} for nodes in groups]
    order = {name: i for i, name in enumerate(g.inputs)}
    order.update({name: len(g.inputs) + i for name, i in g.producer.items()})
    plans = []
    for k, nodes in enumerate(groups):
        inputs = sorted(
            (n for n in consumed[k] - produced[k] if n not in g.initializers and n in order), key=order.get
        )
        if k == len(groups) - 1:
            outputs = list(g.outputs)
        else:
            later = set().union(*consumed[k + 1 :])
            outputs = sorted(produced[k] & later, key=order.get)
        plans.append(StagePlan(k, tuple(sorted(nodes)), tuple(inputs), tuple(outputs)))
    return plans


def crossing(stages: Sequence[StagePlan]) -> list[str]:
    """One line per cut: what crosses it."""
    return [f"stage {s.index} -> later: {', '.join(s.outputs)}" for s in stages[:-1]]


def compare(
    whole: Mapping[str, np.ndarray], chained: Mapping[str, np.ndarray]
) -> list[tuple[str, float, float, bool]]:
    """(output, max abs difference, tolerance, within) per output."""
    rows = []
    for name, ref in whole.items():
        got = chained[name]
        if ref.shape != got.shape:
            rows.append((name, float("inf"), 0.0, False))
            continue
        if ref.dtype.kind == "f":
            diff = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)), initial=0.0))
            tol = RTOL * max(1.0, float(np.max(np.abs(ref), initial=0.0)))
        else:
            diff = float(np.count_nonzero(ref != got))
            tol = 0.0
        rows.append((name, diff, tol, bool(diff <= tol)))
    return rows
