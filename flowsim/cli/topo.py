"""``flowsim topo``: describe a cluster's topology (counts, per-tier bandwidth, bisection) and, given a parallel
layout, where its communicators land: how many scale-up (NVLink) domains each group spans, so which groups
(expert-parallel ones above all) cross the network."""
from __future__ import annotations

import dataclasses

import click

from flowsim import units
from flowsim.cli.common import echo_json, format_table, user_errors
from flowsim.config.cluster import ECMP_MODES, NETWORKS, ClusterConfig
from flowsim.config.layout import EXPERT_RANK_ORDERS, check_expert_layout, expert_rank_order, group_spans
from flowsim.config.loader import list_presets, load_preset
from flowsim.config.training import TrainingConfig
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.network.comm_layout import group_layout
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


GROUP_COLUMNS = [("group", "group", ""), ("ranks", "ranks", "d"), ("stride", "stride", "d"),
                 ("domains", "NVLink domains", "d"), ("fabric", "fabric", "")]
_GROUP_NAMES = {"tp": "tensor parallel", "cp": "context parallel", "dp": "data parallel (gradients)",
                "pp": "pipeline neighbours", "etp": "expert tensor parallel", "ep": "expert parallel",
                "edp": "expert data parallel"}


def layout_groups(cfg: ClusterConfig, tp: int, pp: int, cp: int, ep: int, etp: int, order: str) -> list[dict]:
    """Where the communicators of a layout land on ``cfg`` (Megatron's rank order,
    :func:`flowsim.config.layout.group_spans`; experts in ``order``, empty = Megatron-core's current one): per
    group kind its ranks, the stride between members, the scale-up domains one group spans and whether it
    talks over NVLink only or over the network (groups of one rank are left out)."""
    ways = tp * pp * cp
    if cfg.num_gpus % ways:
        raise ConfigError("--gpus", "must be divisible by tp * pp * cp", f"{cfg.num_gpus} and {tp}*{pp}*{cp}")
    t = TrainingConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
                       expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                       data_parallel_size=cfg.num_gpus // ways, expert_rank_order=order)
    t.validate()
    check_expert_layout(t)
    gpu = get_gpu(cfg.gpu)
    rows = []
    for name, (n, stride) in group_spans(t).items():
        if name not in _GROUP_NAMES or n == 1 or (name == "pp" and pp == 1):
            continue
        domains = group_layout(cfg, gpu, n, stride).n_nodes
        label = _GROUP_NAMES[name] + (f" ({expert_rank_order(t)})" if name == "ep" else "")
        rows.append(dict(group=label, ranks=n, stride=stride, domains=domains,
                         fabric="NVLink" if domains == 1 else "network"))
    return rows


def expert_lines(cfg) -> list[str]:
    """``flowsim estimate``'s line on the experts of a MoE job (none for a dense one or without expert
    parallelism): rank order, dispatcher, and how many NVLink domains an expert-parallel group spans."""
    t = cfg.training
    if not cfg.model.is_moe or t.ep == 1:
        return []
    n, stride = group_spans(t)["ep"]
    domains = group_layout(cfg.cluster, get_gpu(cfg.cluster.gpu), n, stride).n_nodes
    kind = t.moe_token_dispatcher_type + (f"/{t.moe_flex_dispatcher_backend}" if t.moe_token_dispatcher_type == "flex"
                                          else "")
    where = "inside one NVLink domain" if domains == 1 else f"across {domains} NVLink domains (network)"
    return [f"experts etp={t.expert_tensor_parallel_size} dispatcher={kind} order={expert_rank_order(t)}: "
            f"each EP group of {n} ranks (stride {stride}) lies {where}"]


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
@click.option("--tp", type=POS_INT, help="With a layout: tensor-parallel size (prints where each group lands).")
@click.option("--pp", type=POS_INT, help="With a layout: pipeline-parallel size.")
@click.option("--cp", type=POS_INT, help="With a layout: context-parallel size.")
@click.option("--ep", type=POS_INT, help="With a layout: expert-parallel size.")
@click.option("--etp", type=POS_INT, help="With a layout: expert tensor-parallel size.")
@click.option("--expert-rank-order", type=click.Choice(EXPERT_RANK_ORDERS),
              help="Megatron-core's expert rank order: tp-ep-dp-pp (>= 0.10, the default) or tp-cp-ep-dp-pp (<= 0.9).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of the table.")
@user_errors
def topo(cluster, num_gpus, gpu, gpus_per_node, nvlink_domain, nics_per_node, nic_gbps, network, oversubscription,
         switch_radix, leaves_per_rail, ecmp, tp, pp, cp, ep, etp, expert_rank_order, as_json):
    """Describe a cluster: GPUs, NICs, switches per tier, links, bandwidth per tier, bisection bandwidth; with
    layout flags (--tp, --pp, --cp, --ep, --etp), the NVLink domains each communicator spans.

    GB/s and TB/s are decimal (1e9, 1e12 bytes per second), per direction. Examples:

        flowsim topo --cluster dgx-h100 --gpus 4096 --switch-radix 128

        flowsim topo --gpus 32 --tp 4 --ep 8 --etp 4 --expert-rank-order tp-cp-ep-dp-pp
    """
    cfg = cluster_from_options(cluster, num_gpus=num_gpus, gpu=gpu, gpus_per_node=gpus_per_node,
                               nvlink_domain=nvlink_domain, nics_per_node=nics_per_node, nic_gbps=nic_gbps,
                               network=network, oversubscription=oversubscription, switch_radix=switch_radix,
                               leaves_per_rail=leaves_per_rail, ecmp=ecmp)
    summary = build_topology(cfg, get_gpu(cfg.gpu)).summary()
    groups = None
    if any(x is not None for x in (tp, pp, cp, ep, etp, expert_rank_order)):
        groups = layout_groups(cfg, tp or 1, pp or 1, cp or 1, ep or 1, etp or 1, expert_rank_order or "")
    if as_json:
        echo_json({**summary.to_dict(), **({"groups": groups} if groups is not None else {})})
    else:
        click.echo(_report(summary) + ("" if groups is None else
                                       "\n\ncommunicators of the layout (one group of each kind):\n"
                                       + format_table(groups, GROUP_COLUMNS)))
