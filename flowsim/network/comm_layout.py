"""Turn a cluster and a group of ranks into the :class:`~flowsim.nccl_models.CommLayout` NCCL sees.

Rank numbering is node-major: global rank ``r`` runs on host ``r // gpus_per_node`` as its local GPU
``r % gpus_per_node``. A scale-up (NVLink) domain holds ``nvlink_domain`` consecutive ranks (one host on
HGX/DGX, 72 GPUs on an NVL72 rack); ranks of one domain talk over NVLink, so NCCL treats a domain as one
"node" (multi-node NVLink). A communicator of ``n_ranks`` ranks with stride ``s`` holds the global ranks
``r0, r0 + s, r0 + 2s, ...``. A job that cannot fill its domains evenly fills them in order
(:func:`flowsim.config.cluster.job_domain_size`: 2,496 GPUs are 34 NVL72 racks and one of 48 GPUs); a group
with more ranks on one domain than another gets a layout with uneven nodes (``CommLayout.node_ranks``).

NICs: each GPU uses the NICs closest to it (:func:`flowsim.network.topology.nic_span`, the rule the
flow engine's topology wires too). The NICs a communicator can use on a node are the distinct
closest NICs of its ranks there (NCCL's rings and trees enter and leave a node through the NICs closest
to the GPUs they run on); across nodes the smallest count is taken.

NVLink mesh (``nvlink_mesh``, the DGX-1 hybrid cube-mesh): which GPU pairs are linked depends on where the
group sits, so the layout lists the NVLinks among the group's GPUs on each node (``CommLayout.mesh_links``), for
the group itself and for its siblings, the groups of the same shape that tile the ranks with it
(first ranks ``t + j + m * n_ranks * stride``, ``j < stride``, ``t`` the tiling's offset, 0 when the group's
first rank modulo ``n_ranks * stride`` is below ``stride``, as for Megatron's groups of one kind); NCCL's model then
takes the slowest. All groups of one kind run at once and the step waits for the slowest of them, and the flow
engine, which runs them together on one plan, needs one layout for all (TP=2 on a DGX-1V: pairs 0-1 and 4-5 have
one NVLink, 2-3 and 6-7 two; every TP group is priced on one).
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from flowsim.config.cluster import ClusterConfig, job_domain_size
from flowsim.errors import ConfigError
from flowsim.gpu_specs import GPUSpec
from flowsim.nccl_models import CommLayout
from flowsim.nccl_models.versions import DEFAULT_NCCL_VERSION
from flowsim.network.topology import nic_span, nvlink_mesh_links
from flowsim.units import gbps_to_Bps


def closest_nics(local_gpu: int, gpus_per_node: int, nics_per_node: int) -> range:
    """Indices of the NICs closest to a host's local GPU (:func:`flowsim.network.topology.nic_span`).

    Parameters
    ----------
    local_gpu : int
        GPU index on its host, in ``[0, gpus_per_node)``.
    gpus_per_node : int
        GPUs per host.
    nics_per_node : int
        NICs per host.

    Returns
    -------
    range
        NIC indices on the same host.
    """
    first, count = nic_span(local_gpu, gpus_per_node, nics_per_node)
    return range(first, first + count)


def group_layout(cluster: ClusterConfig, gpu: GPUSpec, n_ranks: int, stride: int, *,
                 first_rank: int = 0, nccl_version: str = DEFAULT_NCCL_VERSION) -> CommLayout:
    """Layout of the communicator ``first_rank + k * stride`` (k < ``n_ranks``) on ``cluster``.

    Parameters
    ----------
    cluster : ClusterConfig
        The cluster (GPUs per node, NVLink domain, NICs, CPU).
    gpu : GPUSpec
        The GPU (compute capability, scale-up fabric and bandwidth, NVLS, PCIe).
    n_ranks : int
        Ranks in the communicator, >= 1.
    stride : int
        Distance between consecutive members' global ranks, >= 1.
    first_rank : int, optional
        Global rank of the first member (default 0).
    nccl_version : str, optional
        NCCL release whose cost model applies (``CommLayout.nccl_version``; default 2.30.7).

    Returns
    -------
    CommLayout
        Nodes = scale-up domains spanned, ranks per node, NICs per node usable by the group.

    Raises
    ------
    ConfigError
        Non-positive sizes, a group that runs past the cluster's GPUs, or one whose ranks are spread
        unevenly over the domains of a fabric without NVSwitch (on NVSwitch the layout lists each node's
        ranks, ``CommLayout.node_ranks``: a partly filled NVL72 rack); an unsupported ``nccl_version``.
    """
    for name, v in (("n_ranks", n_ranks), ("stride", stride)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(name, "must be a positive integer", v)
    if not isinstance(first_rank, int) or first_rank < 0:
        raise ConfigError("first_rank", "must be a non-negative integer", first_rank)
    last = first_rank + (n_ranks - 1) * stride
    if last >= cluster.num_gpus:
        raise ConfigError("n_ranks", f"group of {n_ranks} ranks with stride {stride} needs global rank {last}, "
                                     f"beyond the cluster's {cluster.num_gpus} GPUs", n_ranks)
    gpn = cluster.gpus_per_node
    domain = job_domain_size(cluster)
    ranks_by_domain = defaultdict(list)
    for k in range(n_ranks):
        r = first_rank + k * stride
        ranks_by_domain[r // domain].append(r)
    counts = [len(v) for v in ranks_by_domain.values()]
    if len(set(counts)) != 1 and gpu.scaleup_kind != "nvswitch":
        raise ConfigError("stride", f"the group's ranks are spread unevenly over the scale-up domains (modelled "
                                    f"on NVSwitch fabrics only, not {gpu.scaleup_kind})",
                          f"{n_ranks} ranks with stride {stride} from rank {first_rank}")
    nics = min(len({(r // gpn, nic) for r in ranks for nic in closest_nics(r % gpn, gpn, cluster.nics_per_node)})
               for ranks in ranks_by_domain.values())
    mesh = _mesh_links(cluster, gpu, n_ranks, stride, first_rank, counts) if gpu.scaleup_kind == "nvlink_mesh" else ()
    return CommLayout(
        n_ranks=n_ranks,
        n_nodes=len(ranks_by_domain),
        compute_capability=gpu.compute_capability,
        scaleup_Bps=gpu.scaleup_Bps,
        scaleup_links=gpu.scaleup_links,
        vendor=gpu.vendor,
        scaleup_kind=gpu.scaleup_kind,
        nvls=gpu.nvls,
        nics_per_node=nics,
        nic_Bps=gbps_to_Bps(cluster.nic_gbps),
        pcie_Bps=gpu.pcie_Bps,
        cpu=cluster.cpu,
        nccl_version=nccl_version,
        mnnvl=any(len({r // gpn for r in ranks}) > 1 for ranks in ranks_by_domain.values()),
        node_ranks=tuple(counts),
        mesh_links=mesh,
    )


def _mesh_links(cluster: ClusterConfig, gpu: GPUSpec, n_ranks: int, stride: int, first_rank: int,
                counts: list) -> tuple:
    """NVLinks among the ranks of each node of the group and of its siblings (module docstring), one matrix per
    distinct pattern; siblings spread over the nodes otherwise than the group are left out. ``()`` with one rank
    per node."""
    if counts[0] < 2:
        return ()
    gpn = cluster.gpus_per_node
    board = nvlink_mesh_links(gpn, gpu.scaleup_links)
    period = n_ranks * stride
    span = (n_ranks - 1) * stride
    shift = first_rank % period - first_rank % stride  # the tiling's offset: 0 for Megatron's aligned groups
    patterns = set()
    for f in range(min(math.lcm(gpn, period), cluster.num_gpus - span)):  # f and f + lcm: same pattern
        if (f - shift) % period >= stride:
            continue
        by_node = defaultdict(list)
        for k in range(n_ranks):
            by_node[(f + k * stride) // gpn].append((f + k * stride) % gpn)
        if sorted(len(v) for v in by_node.values()) != sorted(counts):
            continue
        for local in by_node.values():
            patterns.add(tuple(map(tuple, board[np.ix_(local, local)].tolist())))
    return tuple(sorted(patterns))


def preset_cluster(cluster: str, nodes: int, gpus_per_node: int | None = None, nics_per_node: int | None = None,
                   nic_gbps: float | None = None, gpu: str | None = None, cpu: str | None = None):
    """The cluster of ``nodes`` hosts of a preset, with overrides, and its GPU.

    Parameters
    ----------
    cluster : str
        Cluster preset name.
    nodes : int
        Hosts in the communicator.
    gpus_per_node, nics_per_node, nic_gbps, gpu, cpu : optional
        Overrides of the preset's fields (None keeps the preset's value); ``nic_gbps`` in Gb/s.

    Returns
    -------
    (ClusterConfig, GPUSpec)
    """
    from flowsim.config.loader import load_preset
    from flowsim.gpu_specs import get_gpu

    fields = load_preset("clusters", cluster)
    for key, value in (("gpus_per_node", gpus_per_node), ("nics_per_node", nics_per_node),
                       ("nic_gbps", nic_gbps), ("gpu", gpu), ("cpu", cpu)):
        if value is not None:
            fields[key] = value
    if gpus_per_node is not None and "nvlink_domain" in fields and fields["nvlink_domain"] % gpus_per_node:
        fields["nvlink_domain"] = gpus_per_node
    fields["num_gpus"] = nodes * fields.get("gpus_per_node", 8)
    fields["name"] = cluster
    cfg = ClusterConfig(**fields)
    cfg.validate()
    return cfg, get_gpu(cfg.gpu)


def preset_layout(cluster: str, nodes: int, gpus_per_node: int | None = None, nics_per_node: int | None = None,
                  nic_gbps: float | None = None, gpu: str | None = None, cpu: str | None = None) -> CommLayout:
    """The communicator of all GPUs of ``nodes`` hosts of a preset cluster (arguments of
    :func:`preset_cluster`).

    Parameters
    ----------
    cluster, nodes, gpus_per_node, nics_per_node, nic_gbps, gpu, cpu
        As in :func:`preset_cluster`.
    """
    cfg, spec = preset_cluster(cluster, nodes, gpus_per_node, nics_per_node, nic_gbps, gpu, cpu)
    return group_layout(cfg, spec, cfg.num_gpus, 1)
