"""The communicator description the NCCL model works on: ranks, nodes, fabric and NICs, in SI units."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from flowsim.errors import ConfigError
from flowsim.nccl_models.versions import DEFAULT_NCCL_VERSION, NcclVersion, parse_nccl_version

VENDORS = ("nvidia", "amd")
SCALEUP_KINDS = ("nvswitch", "xgmi_mesh", "nvlink_mesh", "nvlink_bridge", "pcie")
CPUS = ("intel", "amd", "arm")


@dataclass(frozen=True)
class CommLayout:
    """One communicator as NCCL sees it.

    A "node" here is what NCCL calls a node: a set of ranks that reach each other over the scale-up
    fabric (one HGX host, or a whole NVL72 rack with multi-node NVLink). Ranks of different nodes talk
    over the network. Ranks are spread evenly (every node holds ``n_ranks / n_nodes`` of them) unless
    ``node_ranks`` lists each node's (NVSwitch fabrics only: a partly filled NVL72 rack, a group with more
    ranks on one HGX host than another).

    Attributes
    ----------
    n_ranks : int
        Ranks in the communicator, >= 1.
    n_nodes : int
        Scale-up domains the ranks span, >= 1; must divide ``n_ranks`` unless ``node_ranks`` is given.
    compute_capability : int
        CUDA compute capability x10 (70, 80, 90, 100); for AMD the gfx number (94 MI300X, 95 MI355X).
    vendor : str
        ``nvidia`` (NCCL) or ``amd`` (RCCL, modelled with NCCL's formulas; see docs/NCCL.md).
    scaleup_kind : str
        Intra-node fabric: ``nvswitch``, ``xgmi_mesh``, ``nvlink_mesh`` (direct NVLinks between some GPU pairs,
        ``mesh_links``: the DGX-1 hybrid cube-mesh), ``nvlink_bridge`` or ``pcie``.
    scaleup_Bps : float
        Scale-up bandwidth of one GPU, bytes/s per direction (datasheet); ignored for ``pcie``.
    scaleup_links : int
        Scale-up links per GPU (NVLink links or xGMI peers); NCCL prices NVLink per link.
    nvls : bool
        NVLink SHARP (NVSwitch multicast/reduction) available.
    nics_per_node : int
        Network NICs the communicator's ranks can use on each node (0 when ``n_nodes == 1``).
    nic_Bps : float
        Bandwidth of one NIC, bytes/s per direction.
    pcie_Bps : float
        GPU host PCIe bandwidth, bytes/s per direction (nominal, e.g. 64e9 for Gen5 x16).
    cpu : str
        Host CPU family: ``intel``, ``amd`` or ``arm`` (NCCL's LL cap and network overhead depend on it).
    nccl_version : str
        NCCL release whose cost model applies, ``major.minor[.patch]`` from 2.18 to 2.30 (default 2.30.7);
        stored as ``major.minor.patch``. See :mod:`flowsim.nccl_models.versions`.
    collnet : bool
        IB SHARP in-network reduction through NCCL's CollNet plugin is enabled (``NCCL_COLLNET_ENABLE=1`` on a
        SHARP-capable fabric): CollNetDirect/CollNetChain, and NVLS across nodes, become available.
    min_ctas, max_ctas : int
        ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS``: bounds on the channels a collective runs on; 0 = NCCL's default.
    mnnvl : bool
        Multi-node NVLink: a node (NVLink domain) of the communicator spans several hosts (GB200 NVL72 trays),
        which NCCL joins into one NVLink clique (:mod:`flowsim.nccl_models.execution`, ``MNNVL_BW_EFFICIENCY``).
    node_ranks : tuple of int
        Ranks on each node, in comm rank order (node-major), when the nodes hold different numbers; ``()``
        (default) for an even spread, to which an even tuple is normalised. Their sum is ``n_ranks``, their
        count ``n_nodes``. NCCL's formulas keep ``nRanks / nNodes`` (``ranks_per_node``); its graph search
        runs on every node and keeps the smallest result (:func:`flowsim.nccl_models.graph.graphs_of`).
    mesh_links : tuple
        ``nvlink_mesh`` with several ranks per node: the NVLinks between every pair of a node's ranks (a
        ``ppn x ppn`` symmetric tuple of tuples of ints, local rank order, 0 where two GPUs have no direct link),
        one matrix per distinct pattern among the nodes (and sibling groups, see
        :func:`flowsim.network.comm_layout.group_layout`); the graph search runs on each and keeps the slowest.
        ``()`` otherwise.
    """

    n_ranks: int
    n_nodes: int
    compute_capability: int
    scaleup_Bps: float
    scaleup_links: int
    vendor: str = "nvidia"
    scaleup_kind: str = "nvswitch"
    nvls: bool = False
    nics_per_node: int = 0
    nic_Bps: float = 0.0
    pcie_Bps: float = 64e9
    cpu: str = "intel"
    nccl_version: str = DEFAULT_NCCL_VERSION
    collnet: bool = False
    min_ctas: int = 0
    max_ctas: int = 0
    mnnvl: bool = False
    node_ranks: tuple = ()
    mesh_links: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "nccl_version", str(parse_nccl_version(self.nccl_version)))
        for name in ("n_ranks", "n_nodes", "compute_capability"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(name, "must be a positive integer", v)
        self._check_node_ranks()
        if self.n_ranks % self.n_nodes and not self.node_ranks:
            raise ConfigError("n_nodes", "must divide n_ranks (same ranks on every node) unless node_ranks "
                                         "lists each node's", f"{self.n_ranks} ranks on {self.n_nodes} nodes")
        if self.vendor not in VENDORS:
            raise ConfigError("vendor", f"must be one of {', '.join(VENDORS)}", self.vendor)
        if self.scaleup_kind not in SCALEUP_KINDS:
            raise ConfigError("scaleup_kind", f"must be one of {', '.join(SCALEUP_KINDS)}", self.scaleup_kind)
        for name in ("min_ctas", "max_ctas"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(name, "must be a non-negative integer (0: NCCL's default)", v)
        if self.min_ctas and self.max_ctas and self.min_ctas > self.max_ctas:
            raise ConfigError("min_ctas", "must not exceed max_ctas", f"{self.min_ctas} > {self.max_ctas}")
        if self.cpu not in CPUS:
            raise ConfigError("cpu", f"must be one of {', '.join(CPUS)}", self.cpu)
        if self.scaleup_kind != "pcie":
            if not self.scaleup_Bps > 0:
                raise ConfigError("scaleup_Bps", f"must be > 0 for a {self.scaleup_kind} fabric", self.scaleup_Bps)
            if not isinstance(self.scaleup_links, int) or self.scaleup_links < 1:
                raise ConfigError("scaleup_links", f"must be a positive integer for a {self.scaleup_kind} fabric",
                                  self.scaleup_links)
        if not self.pcie_Bps > 0:
            raise ConfigError("pcie_Bps", "must be > 0", self.pcie_Bps)
        self._check_mesh_links()
        if self.n_nodes > 1:
            if not isinstance(self.nics_per_node, int) or self.nics_per_node < 1:
                raise ConfigError("nics_per_node", "must be >= 1 when the communicator spans several nodes",
                                  self.nics_per_node)
            if not self.nic_Bps > 0:
                raise ConfigError("nic_Bps", "must be > 0 when the communicator spans several nodes", self.nic_Bps)

    @property
    def version(self) -> NcclVersion:
        """The NCCL release modelled (parsed ``nccl_version``)."""
        return parse_nccl_version(self.nccl_version)

    def _check_node_ranks(self) -> None:
        """Validate ``node_ranks`` and store ``()`` for an even spread."""
        if not self.node_ranks:
            object.__setattr__(self, "node_ranks", ())
            return
        try:
            sizes = tuple(int(m) for m in self.node_ranks)
        except (TypeError, ValueError):
            raise ConfigError("node_ranks", "must be a list of positive integers", self.node_ranks) from None
        if len(sizes) != self.n_nodes or min(sizes) < 1 or sum(sizes) != self.n_ranks or \
                any(m != v for m, v in zip(sizes, self.node_ranks)):
            raise ConfigError("node_ranks", f"must list n_nodes = {self.n_nodes} positive integers summing to "
                                            f"n_ranks = {self.n_ranks}", self.node_ranks)
        if len(set(sizes)) > 1 and self.scaleup_kind != "nvswitch":
            raise ConfigError("node_ranks", "uneven nodes are modelled on NVSwitch fabrics only",
                              f"{self.scaleup_kind}: {sizes}")
        object.__setattr__(self, "node_ranks", sizes if len(set(sizes)) > 1 else ())

    def _check_mesh_links(self) -> None:
        """Validate ``mesh_links`` (module rules) and store it as a sorted tuple of tuples of tuples of ints."""
        ppn = self.ranks_per_node
        if self.scaleup_kind != "nvlink_mesh" or ppn < 2:
            if self.mesh_links:
                raise ConfigError("mesh_links", "applies to nvlink_mesh fabrics with several ranks per node",
                                  self.mesh_links)
            object.__setattr__(self, "mesh_links", ())
            return
        rule = (f"must list one or more {ppn} x {ppn} symmetric matrices of NVLink counts (non-negative integers, "
                f"0 on the diagonal, at most scaleup_links = {self.scaleup_links} per row)")
        try:
            mats = tuple(sorted({tuple(tuple(_count(v) for v in row) for row in m) for m in self.mesh_links}))
            ok = bool(mats) and all(
                len(m) == ppn and all(len(row) == ppn for row in m) and all(
                    m[i][j] == m[j][i] >= 0 and (i != j or m[i][j] == 0) for i in range(ppn) for j in range(ppn))
                and max(sum(row) for row in m) <= self.scaleup_links for m in mats)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError("mesh_links", rule, self.mesh_links)
        object.__setattr__(self, "mesh_links", mats)

    @property
    def ranks_per_node(self) -> int:
        """Ranks of the communicator on each node (NCCL's ``ppn``: ``nRanks / nNodes``, rounded down when the
        nodes are uneven, as NCCL's ``tuning.cc`` divides)."""
        return self.n_ranks // self.n_nodes

    @property
    def node_sizes(self) -> tuple:
        """Ranks on each node, in comm rank order (``node_ranks``, or ``ranks_per_node`` on every node)."""
        return self.node_ranks or (self.ranks_per_node,) * self.n_nodes

    @property
    def uneven(self) -> bool:
        """The nodes hold different numbers of ranks."""
        return bool(self.node_ranks)

    def to_dict(self) -> dict:
        """Field mapping (units in the names), plus ``ranks_per_node``."""
        d = asdict(self)
        d["ranks_per_node"] = self.ranks_per_node
        return d


def _count(v) -> int:
    """An integer link count (ints and integral numpy values; not bools or fractions); ValueError otherwise."""
    if isinstance(v, bool) or int(v) != v:
        raise ValueError(v)
    return int(v)
