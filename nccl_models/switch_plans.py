"""Plans whose reduction happens in a switch: NVLS and NVLSTree (the NVSwitch, ``SWITCH``) and CollNet (IB SHARP in
the network, ``NET_SWITCH``). Rank level, numpy only; :mod:`flowsim.nccl_models.plans` assembles them.
"""
from __future__ import annotations

import math

import numpy as np

from flowsim.nccl_models.constants import SIMPLE_STEP_BYTES, Algo
from flowsim.nccl_models.execution import nvls_chunk_bytes
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.rank_orders import (
    chunk_groups, distinct_rings, dtree_parent, even_groups, parent_depth, pipelined, ring_order,
)

__all__ = ["NET_SWITCH", "SWITCH", "collnet_parts", "node_first", "node_of", "nvls_heads", "nvls_parts",
           "nvls_tree_parts"]

SWITCH = -1
"""Rank id of the NVSwitch in NVLS plans (the scale-up switch of the source/destination GPU's domain)."""
NET_SWITCH = -2
"""Rank id of the network's SHARP reduction in CollNet plans: a transfer to it leaves through the GPU's NIC to
its leaf switch, one from it arrives through the leaf and the NIC (the aggregation tree above the leaves carries
one reduced stream per leaf and is not simulated)."""


def _switch_pass(up_ranks: np.ndarray, up_bytes: float, down_ranks: np.ndarray, down_bytes: float, node: np.ndarray,
                 n_nodes: int, frac: np.ndarray, first: int):
    """One NVLS pass through every node's NVSwitch, for each chunk group (``frac``: share of the bytes in each).

    ``up_ranks`` each send ``up_bytes`` (all groups together) to their node's switch (``dst = SWITCH``); a
    zero-byte barrier per node (``src = dst = SWITCH``: the switch-side reduction or multicast) waits for its
    node's ups of the group; then each of ``down_ranks`` receives ``down_bytes`` (``src = SWITCH``) after its
    node's barrier (``node``: int64[n_ranks], each rank's node). Ups and downs also wait for their previous group
    (FIFO). Transfer ids start at ``first``.

    Returns ``(src, dst, payload, step, dependent, dependency, ids)`` with ``ids = (ups int64[G, u],
    barriers int64[G, n_nodes], downs int64[G, d])``.
    """
    G, u, d = frac.size, up_ranks.size, down_ranks.size
    per = u + n_nodes + d
    ids = first + np.arange(G * per).reshape(G, per)
    ups, bars, downs = ids[:, :u], ids[:, u:u + n_nodes], ids[:, u + n_nodes:]
    src = np.tile(np.concatenate([up_ranks, np.full(n_nodes + d, SWITCH)]), G)
    dst = np.tile(np.concatenate([np.full(u + n_nodes, SWITCH), down_ranks]), G)
    payload = (np.concatenate([np.full(u, up_bytes), np.zeros(n_nodes), np.full(d, down_bytes)])[None, :]
               * frac[:, None]).ravel()
    dependent = np.concatenate([bars[:, node[up_ranks]].ravel(), downs.ravel(), ups[1:].ravel(), downs[1:].ravel()])
    dependency = np.concatenate([ups.ravel(), bars[:, node[down_ranks]].ravel(), ups[:-1].ravel(),
                                 downs[:-1].ravel()])
    return src, dst, payload, np.repeat(np.arange(G), per), dependent, dependency, (ups, bars, downs)


def nvls_parts(op: str, size: float, layout: CommLayout, channels: int, heads: int, max_transfers: int):
    """NVLS on one domain: per chunk group, every GPU up to the switch, a barrier, the switch down to every GPU."""
    n = layout.n_ranks
    up_bytes, down_bytes = {"allreduce": (size, size), "allgather": (size / n, size * (n - 1) / n),
                            "reducescatter": (size * (n - 1) / n, size / n)}[op]
    n_chunks = max(1, math.ceil(size / (channels * nvls_chunk_bytes(size, channels * heads))))
    groups = min(n_chunks, max(1, max_transfers // (2 * n + 1)))
    ranks = np.arange(n)
    src, dst, payload, step, dependent, dependency, _ = _switch_pass(
        ranks, up_bytes, ranks, down_bytes, np.zeros(n, dtype=np.int64), 1, even_groups(n_chunks, groups) / n_chunks,
        0)
    return src, dst, payload, np.zeros(src.size, dtype=np.int64), step, dependent, dependency, groups + 2, 0.0


def nvls_heads(layout: CommLayout, heads: int) -> np.ndarray:
    """int64[n_nodes, heads]: comm ranks of each node's NVLS heads, one per NIC: local rank ``h x m / heads``
    with ``m`` the smallest node's ranks (``ppn`` when even), the same NIC rail on every node."""
    m = min(layout.node_sizes)
    return node_first(layout)[:, None] + np.arange(heads)[None, :] * m // heads


def node_first(layout: CommLayout) -> np.ndarray:
    """int64[n_nodes]: the first comm rank of each node (ranks are node-major)."""
    return np.concatenate([[0], np.cumsum(layout.node_sizes)[:-1]]).astype(np.int64)


def node_of(layout: CommLayout) -> np.ndarray:
    """int64[n_ranks]: the node of each comm rank."""
    return np.repeat(np.arange(layout.n_nodes), layout.node_sizes)


def _head_trees(head: np.ndarray, n: int) -> np.ndarray:
    """int64[2 heads, n]: parents of NCCL's double binary tree over the nodes (:func:`dtree_parent`) among the
    heads of each index (row ``2h + t``: head ``h``, tree ``t``); -1 at the roots and for every other rank."""
    nn, heads = head.shape
    R = 2 * heads
    node_parent = np.stack(dtree_parent(nn))[np.arange(R) % 2]  # [R, nn]
    hr = head.T[np.arange(R) // 2]  # [R, nn]: rank of the row's head in each node
    rows = np.arange(R)[:, None]
    parent = np.full((R, n), -1, dtype=np.int64)
    parent[rows, hr] = np.where(node_parent >= 0, hr[rows, np.maximum(node_parent, 0)], -1)
    return parent


def nvls_tree_parts(size: float, layout: CommLayout, channels: int, heads: int, max_transfers: int):
    """NVLSTree AllReduce (research notes sec. 1.7; NCCL ``device/all_reduce.h`` ``runNvlsTree``), per chunk group:

    1. every GPU sends its chunk up to its node's NVSwitch (``S`` in all), a barrier per node (the switch's
       reduction), and the switch sends each head (one per NIC, :func:`nvls_heads`) its share (``S / heads``);
    2. the heads of each index run NCCL's double binary tree over the nodes (:func:`_head_trees`, each tree
       half of the share; on 2 nodes a direct exchange), reduce up then broadcast down (:func:`pipelined`);
       a tree transfer waits for its sender's share of step 1;
    3. each head sends its reduced share up (``S / heads``), a barrier per node (the multicast), and the switch
       sends every GPU the result (``S``); a head's up waits for everything the tree brought it.

    So a GPU sends ``S`` and receives ``S`` through the switch, a head ``S / heads`` more each way, and ``S /
        heads`` over its NIC each way on 2 nodes (on more, up to twice that at a tree's interior heads, as in Tree).
    Chunks of the NVLS size (:func:`nvls_chunk_bytes`), merged by
    :func:`chunk_groups`, which streams (no dependencies) when too few groups are left.
    """
    n, nn, node = layout.n_ranks, layout.n_nodes, node_of(layout)
    head = nvls_heads(layout, heads)
    parent = _head_trees(head, n)
    depth = parent_depth(parent)
    chunk = nvls_chunk_bytes(size, channels * heads)
    n_chunks = max(1, math.ceil(size / (channels * chunk)))
    per_chunk = 2 * (n + nn + head.size + parent.shape[0] * (nn - 1))
    groups, frac, path, fill, stream = chunk_groups(n_chunks, per_chunk, 6 + 2 * depth, min(chunk, size / channels),
                                                 max_transfers)
    ranks, hf = np.arange(n), head.ravel()
    col = np.full(n, -1, dtype=np.int64)
    col[hf] = np.arange(hf.size)  # rank -> column of the head arrays
    r_src, r_dst, r_pay, r_k, r_dep, r_dy, (_, _, shares) = _switch_pass(ranks, size, hf, size / heads, node, nn,
                                                                          frac, 0)
    t_src, t_dst, t_pay, t_ch, t_k, t_dep, t_dy = pipelined(parent, groups, frac, size, True, True, stream)
    tid = r_src.size + np.arange(t_src.size)
    b_src, b_dst, b_pay, b_k, b_dep, b_dy, (b_ups, _, _) = _switch_pass(hf, size / heads, ranks, size, node, nn,
                                                                        frac, tid[-1] + 1)
    if stream:
        dependent = dependency = np.zeros(0, dtype=np.int64)
    else:  # besides each part's own: tree after the sender's share, head's up after what the tree brought it
        dependent = np.concatenate([r_dep, t_dep + r_src.size, b_dep, tid, b_ups[t_k, col[t_dst]], b_ups.ravel()])
        dependency = np.concatenate([r_dy, t_dy + r_src.size, b_dy, shares[t_k, col[t_src]], tid, shares.ravel()])
    switch_channel = np.zeros(r_src.size, dtype=np.int64)  # both switch passes have the same size
    return (np.concatenate([r_src, t_src, b_src]), np.concatenate([r_dst, t_dst, b_dst]),
            np.concatenate([r_pay, t_pay, b_pay]), np.concatenate([switch_channel, t_ch, switch_channel]),
            np.concatenate([r_k, t_k, b_k]), dependent, dependency, path, fill)


def collnet_parts(a: Algo, size: float, layout: CommLayout, channels: int):
    """CollNet AllReduce with IB SHARP (research notes sec. 1.7; NCCL ``device/all_reduce.h``
    ``runCollNetDirect`` / ``runCollNetChain``), streamed: every edge at once, no dependencies, the fill of
    NCCL's 512 KiB Simple chunks over the path's hops as latency [chunk size assumed as Simple's step].

    * Chain: ``R`` chains per node (one per NIC rail, as rings: :func:`distinct_rings`), each through all the
      node's ranks from its head; each chain carries ``S / R``: reduced up the chain (NVLink), the head sends it
      to the network's reduction (:data:`NET_SWITCH`) and receives the result, which goes back down the chain.
    * Direct: ``H = min(ppn, NICs)`` heads per node (local rank ``h x ppn / H``); every rank sends each head its
      ``S / H`` share (NVLink), each head sends its reduced share to the network and receives the result, which
      it sends to every rank of its node.

    Either way a node sends ``S`` to the network and receives ``S`` (``S / R`` or ``S / H`` per NIC), and a rank
    sends ``S`` over NVLink (Chain: all but the chains' heads up, all but their tails down; Direct:
    ``(H - 1) / H`` of ``S`` to the other heads, a head ``S`` more to its node).
    """
    nn, ppn = layout.n_nodes, layout.ranks_per_node
    node = np.arange(nn)[:, None]
    if a == Algo.COLLNET_CHAIN:
        R = distinct_rings(layout, channels)
        order = ring_order(layout, R).reshape(R, nn, ppn)
        child, parent = order[:, :, 1:].ravel(), order[:, :, :-1].ravel()
        head = order[:, :, 0].ravel()
        ch_chain = np.repeat(np.arange(R), nn * (ppn - 1))
        ch_head = np.repeat(np.arange(R), nn)
        src = np.concatenate([child, head, np.full(head.size, NET_SWITCH), parent])
        dst = np.concatenate([parent, np.full(head.size, NET_SWITCH), head, child])
        channel = np.concatenate([ch_chain, ch_head, ch_head, ch_chain])
        payload = np.full(src.size, size / R)
        hops = 2 * ppn
    else:
        H = max(1, min(ppn, layout.nics_per_node))
        heads = node * ppn + np.arange(H)[None, :] * ppn // H  # [nn, H]
        ranks = node * ppn + np.arange(ppn)[None, :]  # [nn, ppn]
        h_idx = np.broadcast_to(np.arange(H)[None, None, :], (nn, ppn, H))
        r_all = np.broadcast_to(ranks[:, :, None], (nn, ppn, H))
        h_all = np.broadcast_to(heads[:, None, :], (nn, ppn, H))
        off = r_all != h_all
        r, h, hi = r_all[off], h_all[off], h_idx[off]
        hf, hfi = heads.ravel(), np.tile(np.arange(H), nn)
        src = np.concatenate([r, hf, np.full(hf.size, NET_SWITCH), h])
        dst = np.concatenate([h, np.full(hf.size, NET_SWITCH), hf, r])
        channel = np.concatenate([hi, hfi, hfi, hi])
        payload = np.full(src.size, size / H)
        hops = 4
    fill = (hops - 1) * min(SIMPLE_STEP_BYTES, size / channels)
    empty = np.zeros(0, dtype=np.int64)
    return src, dst, payload, channel, np.zeros(src.size, dtype=np.int64), empty, empty, 1, fill
