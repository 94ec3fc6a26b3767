"""Cost model: hardware bill, power and the cost of training to a token budget.

Capital cost is the GPU servers, the scale-out NICs, the switch ports and the optical transceivers of the
cluster; it is spread evenly over ``amortization_years``. Operating cost is electricity: the IT power
(GPUs at their TDP, the rest of each host, switch ports) times the PUE times the price of energy.
``cost_per_hour = capex / amortization hours + power * PUE * price``; time to train = token budget /
tokens per second; cost per token = cost per hour / tokens per hour.

Network counts come from the topology flowsim builds for the cluster (:mod:`flowsim.network.topology`): one link
per NIC to its leaf; each leaf has ``ceil(its NICs / oversubscription)`` up-links (the ports an
oversubscribed leaf buys; none with a single leaf per plane); a three-tier fabric has as many spine-core
links again (non-blocking core). Every link has a transceiver at each end and a switch port at each
switch end. Prices per port and per transceiver scale linearly with
the line rate (an assumption: real price lists step by generation).

Defaults. **Prices, the PUE, the electricity price, switch port power and the amortization period are
example values with no source claimed**: they set the scale of the output and should be replaced by your
own quotes (a study's ``cost:`` section, or :class:`CostInputs` fields). Sourced: GPU power is the TDP of
the GPU's datasheet (:mod:`flowsim.gpu_specs`); the rest of the host is
:data:`HOST_POWER_W_PER_GPU`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from flowsim.config import ClusterConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.network.topology import build_topology

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
HOURS_PER_YEAR = 8766.0  # 365.25 days of 24 h
# Host power besides the GPUs (CPUs, memory, NICs, NVSwitches, fans): NVIDIA DGX H100 datasheet, "System
# power usage ~10.2 kW max", minus 8 GPUs at their 700 W TDP, per GPU: (10200 - 8 * 700) / 8 = 575 W.
HOST_POWER_W_PER_GPU = (10_200.0 - 8 * 700.0) / 8


@dataclass(frozen=True)
class CostInputs:
    """Prices and rates of the cost model (all >= 0). Defaults are example values, no source claimed,
    except where a field says otherwise.

    Attributes
    ----------
    server_usd_per_gpu : float
        GPU server price divided by its GPUs (GPU, CPUs, memory, chassis, NVLink), USD. Example value.
    nic_usd_per_gbps : float
        Scale-out NIC price per Gb/s of line rate, USD (400G: 400 x this). Example value.
    switch_port_usd_per_gbps : float
        Switch price per port per Gb/s of port speed, USD. Example value.
    transceiver_usd_per_gbps : float
        Optical transceiver price per Gb/s, USD (two per link). Example value.
    switch_port_power_w : float
        Power per switch port including its optics, W. Example value.
    host_power_w_per_gpu : float
        Host power beside the GPUs, per GPU, W. Default :data:`HOST_POWER_W_PER_GPU` (DGX H100 datasheet).
    gpu_power_w : float
        Power per GPU, W; 0 = the GPU's datasheet TDP.
    pue : float
        Power usage effectiveness (facility / IT power), >= 1. Example value.
    electricity_usd_per_kwh : float
        Energy price, USD per kWh. Example value.
    amortization_years : float
        Years over which capital cost is spread, > 0. Example value.
    """

    server_usd_per_gpu: float = 35_000.0
    nic_usd_per_gbps: float = 4.0
    switch_port_usd_per_gbps: float = 2.5
    transceiver_usd_per_gbps: float = 2.0
    switch_port_power_w: float = 20.0
    host_power_w_per_gpu: float = HOST_POWER_W_PER_GPU
    gpu_power_w: float = 0.0
    pue: float = 1.3
    electricity_usd_per_kwh: float = 0.10
    amortization_years: float = 4.0

    @classmethod
    def from_mapping(cls, values: Mapping | None) -> "CostInputs":
        """Defaults overridden by ``values``; raises ConfigError for unknown keys and bad numbers."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = dict(values or {})
        for k, v in values.items():
            if k not in fields:
                raise ConfigError(f"cost.{k}", f"unknown cost input; known: {', '.join(sorted(fields))}")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"cost.{k}", "must be a number", v)
        return cls(**{k: float(v) for k, v in values.items()}).checked()

    def checked(self) -> "CostInputs":
        """Return self after checking every input is finite and >= 0 (PUE >= 1, amortization > 0)."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not math.isfinite(v) or v < 0:
                raise ConfigError(f"cost.{f.name}", "must be a finite number >= 0", v)
        if self.pue < 1:
            raise ConfigError("cost.pue", "must be >= 1 (facility power / IT power)", self.pue)
        if self.amortization_years <= 0:
            raise ConfigError("cost.amortization_years", "must be > 0", self.amortization_years)
        return self

    def to_dict(self) -> dict:
        """Plain mapping of the fields."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ClusterCost:
    """Bill of materials, power and hourly cost of a cluster.

    Attributes
    ----------
    nics, switch_ports, transceivers : int
        Scale-out NICs, switch ports and optical transceivers.
    capex_usd : dict[str, float]
        Capital cost by part: ``servers``, ``nics``, ``switches``, ``optics``.
    it_power_w : float
        IT power (GPUs, hosts, switch ports), W.
    usd_per_hour : float
        Amortized capital plus energy (with PUE), USD per hour of operation.
    """

    nics: int
    switch_ports: int
    transceivers: int
    capex_usd: dict
    it_power_w: float
    usd_per_hour: float

    @property
    def capex_total_usd(self) -> float:
        """Sum of ``capex_usd``."""
        return sum(self.capex_usd.values())

    def to_dict(self) -> dict:
        """Plain mapping of the fields plus ``capex_total_usd``."""
        return {**dataclasses.asdict(self), "capex_total_usd": self.capex_total_usd}


def _network_links(cluster: ClusterConfig, gpu) -> tuple:
    """(NIC-leaf links, switch-switch links) of the scale-out network as built for ``cluster``."""
    topo = build_topology(cluster, gpu)
    nics_per_leaf = np.bincount(topo.nic_leaf)
    if topo.n_tiers == 1:
        return int(nics_per_leaf.sum()), 0
    uplinks = int(np.ceil(nics_per_leaf / cluster.oversubscription).sum())
    return int(nics_per_leaf.sum()), uplinks * (2 if topo.n_tiers == 3 else 1)


def cluster_cost(cluster: ClusterConfig, inputs: CostInputs) -> ClusterCost:
    """Hardware bill, power and hourly cost of ``cluster`` at the prices and rates of ``inputs`` (see the
    module docstring)."""
    gpu = get_gpu(cluster.gpu)
    nic_links, switch_links = _network_links(cluster, gpu)
    ports = nic_links + 2 * switch_links
    transceivers = 2 * (nic_links + switch_links)
    gbps = cluster.nic_gbps
    capex = {"servers": cluster.num_gpus * inputs.server_usd_per_gpu,
             "nics": nic_links * gbps * inputs.nic_usd_per_gbps,
             "switches": ports * gbps * inputs.switch_port_usd_per_gbps,
             "optics": transceivers * gbps * inputs.transceiver_usd_per_gbps}
    gpu_w = inputs.gpu_power_w or gpu.tdp_w
    power_w = cluster.num_gpus * (gpu_w + inputs.host_power_w_per_gpu) + ports * inputs.switch_port_power_w
    per_hour = sum(capex.values()) / (inputs.amortization_years * HOURS_PER_YEAR) \
        + power_w / 1e3 * inputs.pue * inputs.electricity_usd_per_kwh
    return ClusterCost(nics=nic_links, switch_ports=ports, transceivers=transceivers, capex_usd=capex,
                       it_power_w=power_w, usd_per_hour=per_hour)


@dataclass(frozen=True)
class TrainingCost:
    """Time and money to train on ``token_budget`` tokens.

    Attributes
    ----------
    time_to_train_s : float
        Token budget / tokens per second.
    gpu_hours : float
        GPUs x hours of training.
    cost_usd : float
        Hourly cluster cost x hours of training.
    usd_per_million_tokens : float
        Cost of training on one million tokens.
    """

    time_to_train_s: float
    gpu_hours: float
    cost_usd: float
    usd_per_million_tokens: float

    def to_dict(self) -> dict:
        """Plain mapping of the fields."""
        return dataclasses.asdict(self)


def training_cost(tokens_per_s: float, num_gpus: int, cost: ClusterCost, token_budget: float) -> TrainingCost:
    """Time to train on ``token_budget`` tokens at ``tokens_per_s`` on ``num_gpus`` GPUs, GPU-hours and cost
    at the hourly cost of ``cost`` (a :class:`ClusterCost`)."""
    if not token_budget > 0:
        raise ConfigError("token_budget", "must be > 0 tokens", token_budget)
    seconds = token_budget / tokens_per_s
    hours = seconds / SECONDS_PER_HOUR
    return TrainingCost(time_to_train_s=seconds, gpu_hours=num_gpus * hours, cost_usd=cost.usd_per_hour * hours,
                        usd_per_million_tokens=cost.usd_per_hour / (tokens_per_s * SECONDS_PER_HOUR) * 1e6)
