"""Cluster description: GPUs, nodes, scale-up domain, NICs and the scale-out network."""
from __future__ import annotations

from dataclasses import dataclass

from flowsim.config import bounds
from flowsim.errors import ConfigError, check_ints

NETWORKS = ("rail_optimized", "rail_only", "fat_tree")
ECMP_MODES = ("hash", "ideal")
CPUS = ("intel", "amd", "arm")
MAX_POWER_LIMIT_W = 5000.0
"""Largest accepted GPU power limit: 3.5x the largest board power in gpu_specs (GB300, 1,400 W)."""


@dataclass(frozen=True)
class ClusterConfig:
    """A GPU cluster. Sizes are counts; bandwidths are in the units named by each field.

    Attributes
    ----------
    gpu : str
        GPU key (see ``flowsim gpus``) or a path to a user spec file.
    num_gpus : int
        GPUs in the job.
    gpus_per_node : int
        GPUs per host (server / compute tray).
    nvlink_domain : int
        GPUs that share one scale-up (NVLink/NVSwitch) fabric; equals ``gpus_per_node`` for HGX/DGX
        nodes and 72 for GB200/GB300 NVL72 racks. Must be a multiple of ``gpus_per_node``.
    nics_per_node : int
        Scale-out NICs (ports) per host used for GPU traffic.
    nic_gbps : float
        Line rate of one NIC in Gb/s (1e9 bit/s).
    network : str
        ``rail_optimized`` (NIC i of every node on rail i, two-tier Clos per rail group, spines across),
        ``rail_only`` (no spine: rails are disjoint), or ``fat_tree`` (NICs attach to leaves by node, not
        by rail).
    oversubscription : float
        Leaf down-link to up-link bandwidth ratio, >= 1 (1 = non-blocking).
    switch_radix : int
        Ports per switch (leaf and spine).
    nic_latency_s : float
        One-way latency of a network hop in seconds (NIC + switch), used by the flow model.
    cpu : str
        Host CPU family (``intel``, ``amd``, ``arm``); NCCL's model uses it for its LL bandwidth cap and
        network overhead.
    name : str
        Preset name, for display.
    ecmp : str
        How flows spread over equal-cost uplinks: ``hash`` (each flow takes one uplink chosen by a
        deterministic hash of source, destination and flow id, as switch ECMP does) or ``ideal`` (perfect
        balance: each leaf's and spine's parallel uplinks act as one bundle, as with packet spraying).
    leaves_per_rail : int
        Leaf switches per rail (``rail_optimized``, ``rail_only``); 0 (default) uses as few as the radix
        allows, ``ceil(num_nodes / (switch_radix // 2))``.
    power_limit_w : float
        Board power limit of every GPU in W; 0 (default) keeps the GPU spec's own. Compute ceilings measured at a
        higher board power are derated by ``(limit / measured) ** (1/3)`` (:mod:`flowsim.kernels.power`).
    """

    gpu: str
    num_gpus: int
    gpus_per_node: int = 8
    nvlink_domain: int = 0
    nics_per_node: int = 8
    nic_gbps: float = 400.0
    network: str = "rail_optimized"
    oversubscription: float = 1.0
    switch_radix: int = 64
    nic_latency_s: float = 2.0e-6
    cpu: str = "intel"
    name: str = "custom"
    ecmp: str = "hash"
    leaves_per_rail: int = 0
    power_limit_w: float = 0.0

    def __post_init__(self):
        if self.nvlink_domain == 0:
            object.__setattr__(self, "nvlink_domain", self.gpus_per_node)

    @property
    def num_nodes(self) -> int:
        """Hosts in the job (a job smaller than one node uses part of one node)."""
        return -(-self.num_gpus // self.gpus_per_node)

    @property
    def gpus_per_node_used(self) -> int:
        """GPUs of the job on each of its hosts."""
        return min(self.num_gpus, self.gpus_per_node)

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        check_ints(self, ("num_gpus", "gpus_per_node", "nics_per_node", "switch_radix", "nvlink_domain"), 1)
        if self.num_gpus % self.gpus_per_node and self.num_gpus > self.gpus_per_node:
            raise ConfigError("num_gpus", "must be a multiple of gpus_per_node",
                              f"{self.num_gpus} and {self.gpus_per_node}")
        if self.nvlink_domain % self.gpus_per_node:
            raise ConfigError("nvlink_domain", "must be a multiple of gpus_per_node",
                              f"{self.nvlink_domain} and {self.gpus_per_node}")
        b = bounds
        b.check_int_max(self, ("num_gpus",), b.MAX_GPUS, "5x the largest announced cluster")
        b.check_int_max(self, ("gpus_per_node",), b.MAX_GPUS_PER_NODE, "no host holds more GPUs")
        b.check_int_max(self, ("nvlink_domain",), b.MAX_NVLINK_DOMAIN, "100x the largest announced NVLink domain")
        b.check_int_max(self, ("nics_per_node",), b.MAX_NICS_PER_NODE, "no host holds more NICs")
        b.check_int_max(self, ("switch_radix",), b.MAX_SWITCH_RADIX, "8x the largest switch ASIC")
        b.check_float("nic_gbps", self.nic_gbps, b.MIN_NIC_GBPS, b.MAX_NIC_GBPS,
                      f"must be a finite number in [{b.MIN_NIC_GBPS:g}, {b.MAX_NIC_GBPS:g}] Gb/s (1 GbE to 125x "
                      "today's fastest NIC)")
        b.check_float("oversubscription", self.oversubscription, 1.0, b.MAX_OVERSUBSCRIPTION,
                      f"must be a finite number in [1, {b.MAX_OVERSUBSCRIPTION:g}] (1 = non-blocking)")
        if self.network not in NETWORKS:
            raise ConfigError("network", f"must be one of {', '.join(NETWORKS)}", self.network)
        if isinstance(self.power_limit_w, bool) or not isinstance(self.power_limit_w, (int, float)) \
                or not 0.0 <= self.power_limit_w <= MAX_POWER_LIMIT_W:  # NaN fails the comparison
            raise ConfigError("power_limit_w", f"must be a finite number in [0, {MAX_POWER_LIMIT_W:g}] W "
                              "(0 = the GPU's own)", self.power_limit_w)
        if self.cpu not in CPUS:
            raise ConfigError("cpu", f"must be one of {', '.join(CPUS)}", self.cpu)
        bounds.check_float("nic_latency_s", self.nic_latency_s, 0.0, bounds.MAX_NIC_LATENCY_S,
                           f"must be a finite number in [0, {bounds.MAX_NIC_LATENCY_S:g}] s")
        if self.ecmp not in ECMP_MODES:
            raise ConfigError("ecmp", f"must be one of {', '.join(ECMP_MODES)}", self.ecmp)
        if not isinstance(self.leaves_per_rail, int) or isinstance(self.leaves_per_rail, bool) \
                or self.leaves_per_rail < 0:
            raise ConfigError("leaves_per_rail", "must be an integer >= 0 (0 = as few as the radix allows)",
                              self.leaves_per_rail)
        if self.leaves_per_rail > self.num_nodes:
            raise ConfigError("leaves_per_rail", "must not exceed the hosts of the job (every leaf needs a host)",
                              f"{self.leaves_per_rail} leaves, {self.num_nodes} hosts")


def job_domain_size(cluster: ClusterConfig) -> int:
    """GPUs of the job in each scale-up (NVLink) domain it uses.

    A job that does not fill whole domains is spread evenly over the fewest domains that hold it, in whole
    hosts: 128 GPUs on NVL72 racks (18 trays of 4) run as 2 racks of 64, as schedulers place such jobs.
    One that cannot be spread evenly fills whole domains in order, the last one partly (2,496 GPUs: 34 racks
    of 72 and one of 48, as the topology places them): the domain size is returned and rank ``r`` is in domain
    ``r // size``; :func:`job_domains` lists each domain's GPUs.
    """
    gpn = cluster.gpus_per_node
    domain = max(cluster.nvlink_domain, gpn)
    n = cluster.num_gpus
    if n <= domain:
        return n
    domains = -(-n // domain)
    per = n // domains
    if n % domains or per % gpn:
        return domain
    return per


def job_domains(cluster: ClusterConfig) -> tuple[int, ...]:
    """GPUs of the job in each scale-up domain it uses, in order (:func:`job_domain_size`'s placement)."""
    size = job_domain_size(cluster)
    full, rest = divmod(cluster.num_gpus, size)
    return (size,) * full + ((rest,) if rest else ())
