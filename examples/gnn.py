"""A tiny graph attention network trained on a synthetic batch of graphs, with no padding.

The batch holds graphs of different sizes. Two RaggedArrays describe it:

* ``nodes``: ``(num_graphs, nodes*, features)``, the node features grouped by graph;
* ``edges``: ``(num_nodes, in_edges*)``, for every node the source nodes of its incoming edges
  (a node without incoming edges has an empty segment).

One attention layer scores every edge, normalises the scores with a softmax over each node's
incoming edges (the segment softmax kernel), and sums the weighted messages per node with
``ragged.sum(..., axis="in_edge")`` (axis 1, by name). A mean over each graph's nodes (``ragged.mean``) reads the graph
out. The target of each graph is the mean over its nodes of the mean of their in-neighbours'
first feature, which one attention layer can learn.

Run: ``python examples/gnn.py`` (a few seconds), or ``--small`` for CI.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import ragged


def make_graphs(num_graphs: int, features: int, gen: torch.Generator):
    """Random graphs: node features grouped by graph, and each node's incoming edges."""
    sizes = torch.randint(4, 25, (num_graphs,), generator=gen).tolist()
    x = torch.randn(sum(sizes), features, generator=gen)
    sources, in_degree = [], []
    start = 0
    for size in sizes:
        for _ in range(size):
            degree = int(torch.randint(0, 5, (), generator=gen))  # 0: an empty segment
            sources.append(start + torch.randint(0, size, (degree,), generator=gen))
            in_degree.append(degree)
        start += size
    nodes = ragged.from_lengths(x, sizes, axes=("graph", "node", "feature"))
    edges = ragged.from_lengths(torch.cat(sources), in_degree, axes=("node", "in_edge"))
    return nodes, edges


def edge_softmax(scores: ragged.RaggedArray) -> ragged.RaggedArray:
    """Softmax over each node's incoming edges: the ragged axis of ``(node, in_edge*)``."""
    return ragged.softmax(scores, "in_edge")


def targets(nodes: ragged.RaggedArray, edges: ragged.RaggedArray) -> torch.Tensor:
    """Per graph: mean over nodes of the mean first feature of the node's in-neighbours."""
    neighbour = edges.with_values(nodes.values[edges.values, 0])
    per_node = ragged.mean(neighbour, axis="in_edge", fill_value=0.0)  # no in-edges: 0
    return ragged.mean(nodes.with_values(per_node, axes=("graph", "node")), axis="node")


class GraphAttention(torch.nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.project = torch.nn.Linear(features, hidden)
        self.attend_source = torch.nn.Parameter(torch.randn(hidden) / hidden**0.5)
        self.attend_target = torch.nn.Parameter(torch.randn(hidden) / hidden**0.5)

    def forward(self, h: torch.Tensor, edges: ragged.RaggedArray) -> torch.Tensor:
        z = self.project(h)  # [num_nodes, hidden]
        source = edges.values  # [num_edges]: the source node of each edge
        target = edges.segment_ids  # [num_edges]: its destination (the segment)
        score = F.leaky_relu(z[source] @ self.attend_source + z[target] @ self.attend_target, 0.2)
        alpha = edge_softmax(edges.with_values(score))  # (num_nodes, in_edges*)
        messages = edges.with_values(
            alpha.values[:, None] * z[source], axes=("node", "in_edge", "hidden")
        )
        return ragged.sum(messages, axis="in_edge")  # [num_nodes, hidden]; no in-edges: 0


class TinyGNN(torch.nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.attention = GraphAttention(features, hidden)
        self.skip = torch.nn.Linear(features, hidden)
        self.readout = torch.nn.Linear(hidden, 1)

    def forward(self, nodes: ragged.RaggedArray, edges: ragged.RaggedArray) -> torch.Tensor:
        h = torch.relu(self.attention(nodes.values, edges) + self.skip(nodes.values))
        hidden = nodes.with_values(h, axes=("graph", "node", "hidden"))
        pooled = ragged.mean(hidden, axis="node")  # [num_graphs, hidden]
        return self.readout(pooled).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a tiny GNN on ragged graph batches.")
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--graphs", type=int, default=None, help="graphs in the batch")
    parser.add_argument("--steps", type=int, default=None, help="training steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    graphs = args.graphs or (8 if args.small else 128)
    steps = args.steps or (40 if args.small else 300)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    nodes, edges = make_graphs(graphs, features=8, gen=gen)
    y = targets(nodes, edges)
    empty = int((edges.lengths == 0).sum())
    print(
        f"batch: {graphs} graphs, {nodes.values.shape[0]} nodes "
        f"({int(nodes.lengths.min())}-{nodes.partition.max_length()} per graph), "
        f"{edges.values.shape[0]} edges grouped by destination ({empty} nodes without "
        "incoming edges), no padding"
    )
    model = TinyGNN(features=8, hidden=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for step in range(steps):
        loss = F.mse_loss(model(nodes, edges), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = loss.item() if first is None else first
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.5f}")
    baseline = F.mse_loss(y.mean().expand_as(y), y).item()
    print(
        f"loss {first:.5f} -> {loss.item():.5f} (predicting the mean target scores {baseline:.5f})"
    )


if __name__ == "__main__":
    main()
