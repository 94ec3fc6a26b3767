"""``flowsim topo``: describe a cluster's topology (counts, per-tier bandwidth, bisection)."""
from __future__ import annotations

import dataclasses

import click

from flowsim import units
from flowsim.cli.common import echo_json, format_table, user_errors
from flowsim.config.cluster import ECMP_MODES, NETWORKS, ClusterConfig
from flowsim.config.loader import list_presets, load_preset
from flowsim.gpu_specs import get_gpu
from flowsim.network.topology import build_topology

POS_INT = click.IntRange(min=1)
_FIELDS = {f.name for f in dataclasses.fields(ClusterConfig)}

COUNT_ROWS = [("gpus", "GPUs"), ("nodes", "hosts"), ("nics", "NICs"), ("nvswitches", "NVSwitch domains"),
              ("leaves", "leaf switches"), ("spines", "spine switches"), ("cores", "core switches"),
              ("links", "directed links")]
TIER_COLUMNS = [("tier", "tier", ""), ("links", "links", "d"), ("link_GBps", "GB/s per link", ".1f"),
                ("total_TBps", "total TB/s", ".2f")]


def cluster_from_options(cluster: str, **overrides) -> ClusterConfig:
    """A ClusterConfig from a preset name and flag overrides (``None`` = keep the preset's value)."""
    fields = {k: v for k, v in load_preset("clusters", cluster).items() if k in _FIELDS}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if "num_gpus" not in fields:
        fields["num_gpus"] = fields.get("nvlink_domain") or fields.get("gpus_per_node", 8)
    return ClusterConfig(**fields)


def _report(s) -> str:
    head = (f"{s.name}: {s.gpus} GPUs, {s.network} ({s.switch_tiers}-tier, ECMP {s.ecmp}), scale-up "
            f"{s.scaleup_kind} domains of {s.scaleup_domain_gpus} GPUs, NIC {s.nic_Bps / units.GB:g} GB/s")
    counts = "\n".join(f"  {label:<18}{getattr(s, key):>10d}" for key, label in COUNT_ROWS)
    rows = [{"tier": t.tier, "links": t.links, "link_GBps": t.link_Bps / units.GB, "total_TBps": t.total_Bps / units.TB}
            for t in s.tiers]
    over = "-" if s.leaf_oversubscription != s.leaf_oversubscription else f"{s.leaf_oversubscription:.3g}:1"
    tail = (f"bisection bandwidth (scale-out, one direction): {s.bisection_Bps / units.TB:.3f} TB/s\n"
            f"oversubscription: configured {s.oversubscription:g}:1, fullest leaf as built {over}")
    return "\n".join([head, "", counts, "", format_table(rows, TIER_COLUMNS), "", tail])


@click.command("topo")
@click.option("--cluster", default="dgx-h100", show_default=True,
              help=f"Cluster preset ({', '.join(list_presets('clusters'))}).")
@click.option("--gpus", "num_gpus", type=POS_INT, help="GPUs in the job (default: one scale-up domain).")
@click.option("--gpu", help="GPU key (see `flowsim gpus`) or a GPU spec YAML file.")
@click.option("--gpus-per-node", type=POS_INT, help="GPUs per host.")
@click.option("--nvlink-domain", type=POS_INT, help="GPUs per NVLink domain (72 for NVL72).")
@click.option("--nics-per-node", type=POS_INT, help="Scale-out NICs per host.")
@click.option("--nic-gbps", type=click.FloatRange(min=0, min_open=True), help="Line rate of one NIC, Gb/s.")
@click.option("--network", type=click.Choice(NETWORKS), help="Scale-out network.")
@click.option("--oversubscription", type=float, help="Leaf down/up bandwidth ratio, >= 1.")
@click.option("--switch-radix", type=int, help="Ports per switch.")
@click.option("--leaves-per-rail", type=int, help="Leaf switches per rail (0 = fewest the radix allows).")
@click.option("--ecmp", type=click.Choice(ECMP_MODES), help="hash (per-flow ECMP) or ideal (perfect spreading).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of the table.")
@user_errors
def topo(cluster, num_gpus, gpu, gpus_per_node, nvlink_domain, nics_per_node, nic_gbps, network, oversubscription,
         switch_radix, leaves_per_rail, ecmp, as_json):
    """Describe a cluster: GPUs, NICs, switches per tier, links, bandwidth per tier, bisection bandwidth.

    GB/s and TB/s are decimal (1e9, 1e12 bytes per second), per direction. Example:

        flowsim topo --cluster dgx-h100 --gpus 4096 --switch-radix 128
    """
    cfg = cluster_from_options(cluster, num_gpus=num_gpus, gpu=gpu, gpus_per_node=gpus_per_node,
                               nvlink_domain=nvlink_domain, nics_per_node=nics_per_node, nic_gbps=nic_gbps,
                               network=network, oversubscription=oversubscription, switch_radix=switch_radix,
                               leaves_per_rail=leaves_per_rail, ecmp=ecmp)
    summary = build_topology(cfg, get_gpu(cfg.gpu)).summary()
    if as_json:
        echo_json(summary.to_dict())
    else:
        click.echo(_report(summary))
