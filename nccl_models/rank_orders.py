"""Rank orders and pipelines of NCCL's plans: rings, NCCL's binary trees, chunk grouping (numpy only).

Used by :mod:`flowsim.nccl_models.plans` and :mod:`flowsim.nccl_models.switch_plans`; the rules are described
in :mod:`flowsim.nccl_models.plans` (rank placement, structure, merging).
"""
from __future__ import annotations

import numpy as np

from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.layout import CommLayout

__all__ = ["STREAM_CHUNKS_PER_HOP", "btree_parent", "chunk_groups", "distinct_rings", "dtree_parent", "even_groups",
           "is_mesh", "parent_depth", "pipelined", "ring_order", "walecki_rings", "zigzag_path"]


def even_groups(total: int, n_groups: int) -> np.ndarray:
    """Sizes of ``n_groups`` consecutive groups splitting ``total`` items as evenly as possible."""
    return np.diff(np.linspace(0, total, n_groups + 1).round().astype(np.int64))


def btree_parent(n: int) -> np.ndarray:
    """Parent of each of ``n`` nodes in NCCL's binary tree (``trees.cc`` ``ncclGetBtree``); -1 at root 0.

    Node ``r > 0`` with lowest set bit ``b`` has parent ``(r ^ b) | (b << 1)``, or ``r ^ b`` when that is
    ``>= n``.
    """
    r = np.arange(n, dtype=np.int64)
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= n, r ^ bit, up)
    up[0] = -1
    return up


def dtree_parent(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents in NCCL's double binary tree over ``n`` nodes (``trees.cc`` ``ncclGetDtree``).

    Tree 0 is :func:`btree_parent`; tree 1 mirrors it (``n - 1 - r``) when ``n`` is even, else shifts it by one,
    so that every node is a leaf in one tree and interior in the other.
    """
    t0 = btree_parent(n)
    r = np.arange(n, dtype=np.int64)
    if n % 2 == 0:
        p = t0[n - 1 - r]
        t1 = np.where(p < 0, -1, n - 1 - p)
    else:
        p = t0[(r - 1) % n]
        t1 = np.where(p < 0, -1, (p + 1) % n)
    return t0, t1


def is_mesh(layout: CommLayout) -> bool:
    """A full mesh (xGMI) with an even number >= 4 of ranks per node: rings follow Walecki's cycles."""
    ppn = layout.ranks_per_node
    return layout.scaleup_kind == "xgmi_mesh" and ppn >= 4 and ppn % 2 == 0


def distinct_rings(layout: CommLayout, channels: int) -> int:
    """Rings (trees) with distinct paths.

    One node: 1 on a switch (every channel follows the same ring), ``ppn - 2`` on a full mesh (Walecki's
    edge-disjoint directed Hamiltonian cycles, :func:`walecki_rings`), the ring graph's channels on an NVLink
    mesh (``Graphs.mesh_rings``, which may repeat a cycle). Several nodes: ``min(channels, NICs, ppn)``, one
    ring per NIC rail.
    """
    rings = graphs_of(layout).mesh_rings if layout.mesh_links else ()
    if layout.n_nodes == 1 and rings:
        return min(channels, len(rings))
    if layout.n_nodes == 1:
        return min(channels, layout.ranks_per_node - 2) if is_mesh(layout) else 1
    return max(1, min(channels, layout.nics_per_node, min(layout.node_sizes)))


def walecki_rings(m: int) -> np.ndarray:
    """int64[m - 2, m]: ``m - 2`` directed rings over ``m`` (even, >= 4) GPUs that share no directed link.

    Walecki's decomposition of the complete graph K_m into ``(m - 2) / 2`` Hamiltonian cycles (Alspach, "The
    wonderful Walecki construction", Bull. ICA 52, 2008): GPU ``m - 1`` then ``k, k + 1, k - 1, k + 2, k - 2,
    ...`` (mod ``m - 1``) for cycle ``k``; each cycle is used in both directions. A mesh has one link per ordered
    GPU pair, so rings on distinct directed links never share one (RCCL's rings on an xGMI mesh spread over its
    links the same way [inferred]).
    """
    j = np.arange(m - 1)
    offset = np.where(j % 2 == 1, (j + 1) // 2, -((j + 1) // 2))
    k = np.arange((m - 2) // 2)[:, None]
    cycles = np.concatenate([np.full((k.size, 1), m - 1), (k + offset[None, :]) % (m - 1)], axis=1)
    return np.stack([cycles, cycles[:, ::-1]], axis=1).reshape(m - 2, m)


def zigzag_path(m: int) -> np.ndarray:
    """int64[m]: ``0, 1, m - 1, 2, m - 2, ...``; for even ``m`` its steps ``+1, -2, +3, ...`` are distinct mod ``m``.

    So its ``m`` translates ``(path + k) mod m`` are Hamiltonian paths over ``m`` GPUs that share no directed
    link (they decompose the complete directed graph): each starts at GPU ``k`` and ends at ``k + m / 2``.
    """
    j = np.arange(m)
    return np.where(j % 2 == 1, (j + 1) // 2, -(j // 2)) % m


def ring_order(layout: CommLayout, n_rings: int) -> np.ndarray:
    """int64[n_rings, n]: comm rank at each ring position (module docstring).

    Ring ``c`` starts each node at local rank ``s_c = c * ppn / n_rings`` and follows the local ranks in order
    (switch). On a full mesh it follows the Walecki ring ``c`` (one node, :func:`walecki_rings`) or the
    zigzag path from ``s_c + j * ppn / 2`` in node ``j`` (several nodes, :func:`zigzag_path`): no two rings
    share a mesh link, and a ring enters node ``j + 1`` at the local rank where it left node ``j`` (one rail).
    On an NVLink mesh (``Graphs.mesh_rings``) ring ``c`` follows the search's cycle ``c`` (modulo their number)
    along direct NVLinks, from ``s_c`` in every node on several nodes.
    Uneven nodes (switch only): every node is entered at local rank ``s_c = c * m / n_rings`` of the smallest
    node's ``m`` ranks, so that a ring keeps one NIC rail in every node (NCCL's inter-node channels use the same
    NIC on every node), and then follows its own ranks in order.
    """
    c = np.arange(n_rings)[:, None]
    if layout.uneven:
        sizes = np.asarray(layout.node_sizes)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        start = c * sizes.min() // n_rings
        return np.concatenate([f + (start + np.arange(m)[None, :]) % m for f, m in zip(first, sizes)], axis=1)
    ppn = layout.ranks_per_node
    start = c * ppn // n_rings
    rings = graphs_of(layout).mesh_rings if layout.mesh_links else ()
    if rings:
        cyc = np.asarray(rings, dtype=np.int64)[c[:, 0] % len(rings)]  # [n_rings, ppn]
        if layout.n_nodes > 1:  # rotate cycle c to start at s_c
            at = np.argmax(cyc == start, axis=1)[:, None]
            cyc = np.take_along_axis(cyc, (at + np.arange(ppn)[None, :]) % ppn, axis=1)
        local = cyc
    elif is_mesh(layout) and layout.n_nodes == 1:
        local = walecki_rings(ppn)[:n_rings]
    elif is_mesh(layout):  # node j starts where node j - 1 left: the ring stays on one NIC rail
        shift = start[:, :, None] + np.arange(layout.n_nodes)[None, :, None] * (ppn // 2)
        local = (zigzag_path(ppn)[None, None, :] + shift) % ppn
    else:
        local = (start + np.arange(ppn)) % ppn
    node = np.arange(layout.n_nodes)[None, :, None]
    local = local if local.ndim == 3 else local[:, None, :]
    return (node * ppn + local).reshape(n_rings, -1)


def pipelined(parent: np.ndarray, n_chunks: int, chunk_frac: np.ndarray, total_bytes: float,
               reduce: bool, bcast: bool, stream: bool):
    """Transfers of chunks pipelined along the trees of ``parent`` (int64[R, n], -1 at a root).

    Reduce: ``x -> parent[x]`` after the chunk arrived from every child of ``x``; broadcast: ``parent[x] -> x``
    after the chunk arrived at ``parent[x]`` (from its parent, or, at a root, from the reduce of its children).
    Every edge carries ``total_bytes / R`` split over the chunks (``chunk_frac``); chunk ``k`` of an edge also
    waits for chunk ``k - 1`` (FIFO). ``stream``: one chunk per edge and no dependencies (every edge streams at
    once, the steady state of a long pipeline).
    """
    R, n = parent.shape
    ring_of, child = np.nonzero(parent >= 0)
    par = parent[ring_of, child]
    E = child.size
    edge_of = np.full((R, n), -1, dtype=np.int64)
    edge_of[ring_of, child] = np.arange(E)
    phases = int(reduce) + int(bcast)
    shape = (n_chunks, phases, E)
    tid = np.arange(n_chunks * phases * E).reshape(shape)
    k, ph, e = (a.ravel() for a in np.indices(shape))
    up = reduce & (ph == 0)
    src = np.where(up, child[e], par[e])
    dst = np.where(up, par[e], child[e])
    payload = total_bytes / R * chunk_frac[k]
    if stream:
        none = np.zeros(0, dtype=np.int64)
        return src, dst, payload, ring_of[e], k, none, none
    pairs = [(tid[1:].ravel(), tid[:-1].ravel())]  # FIFO
    above = edge_of[ring_of, par]  # edge from the parent upwards, -1 at a root
    inner = above >= 0
    if reduce:  # the edge above waits for each child edge
        pairs.append((tid[:, 0, above[inner]].ravel(), tid[:, 0, np.flatnonzero(inner)].ravel()))
    if bcast:
        b = phases - 1
        pairs.append((tid[:, b, np.flatnonzero(inner)].ravel(), tid[:, b, above[inner]].ravel()))
        if reduce:  # below a root: wait for the reduce of every child edge of that root
            top = np.flatnonzero(~inner)
            d1, d2 = np.meshgrid(top, top, indexing="ij")
            same = ring_of[d1] == ring_of[d2]
            pairs.append((tid[:, b, d1[same]].ravel(), tid[:, 0, d2[same]].ravel()))
    dependent = np.concatenate([p[0] for p in pairs])
    dependency = np.concatenate([p[1] for p in pairs])
    return src, dst, payload, ring_of[e], k, dependent, dependency


def parent_depth(parent: np.ndarray) -> int:
    """Edges on the longest path from a rank to its root (pointer doubling, vectorised over ranks: each round
    adds the depth of the current ancestor and jumps to its ancestor, ``log2(depth)`` rounds)."""
    rows = np.arange(parent.shape[0])[:, None]
    depth = (parent >= 0).astype(np.int64)  # edges from each rank to ``anc``
    anc = parent.copy()
    while np.any(anc >= 0):
        up = np.maximum(anc, 0)
        has = anc >= 0
        depth = depth + np.where(has, depth[rows, up], 0)
        anc = np.where(has, anc[rows, up], -1)
    return int(depth.max())


STREAM_CHUNKS_PER_HOP = 4
"""A tree or chain whose budget allows fewer than this many chunk groups per hop of its depth runs as a stream
(module docstring): with ``C`` chunk groups over ``D`` hops the fluid pipeline costs ``(D - 1) / C`` of the
bandwidth time in fill, 25 % at 4 per hop, more than the stream's error (a cost cap, set by hand)."""


def chunk_groups(n_chunks: int, edges_per_chunk: int, depth: int, chunk_bytes: float, max_transfers: int):
    """(chunk groups, fraction of the bytes in each, critical path, fill bytes, stream) of a tree/chain pipeline.

    Merges NCCL's ``n_chunks`` chunks into at most ``max_transfers / edges_per_chunk`` groups. When that leaves
    fewer than :data:`STREAM_CHUNKS_PER_HOP` groups per hop of ``depth`` (and NCCL has more), the pipeline runs as
    a stream: one group, no dependencies, and the fill of NCCL's real chunks, ``(depth - 1)`` chunks of
    ``chunk_bytes``, is added as latency.
    """
    groups = min(n_chunks, max(1, max_transfers // max(edges_per_chunk, 1)))
    if groups < min(n_chunks, STREAM_CHUNKS_PER_HOP * depth):
        return 1, np.ones(1), 1, (depth - 1) * chunk_bytes, True
    return groups, even_groups(n_chunks, groups) / n_chunks, depth + groups - 1, 0.0, False
