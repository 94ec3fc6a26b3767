"""``flowsim estimate``: predict one training step from presets, a config file and flags."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, notice_first_compile, user_errors
from flowsim.config import ALIASES, list_presets
from flowsim.config.training import SCHEDULES
from flowsim.errors import ConfigError
from flowsim.io_text import check_output_dir, check_output_file
from flowsim.cli.topo import expert_lines

POS_INT = click.IntRange(min=1)


def _parse_set(values) -> dict:
    out = {}
    for item in values:
        if "=" not in item:
            raise ConfigError("--set", "must be KEY=VALUE", item)
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _recompute_label(t: dict) -> str:
    """``none``, ``full``, or ``selective[...]`` with the policy (Megatron modules or torchtitan's option)."""
    if t["recompute_granularity"] != "selective":
        return t["recompute_granularity"]
    what = f"ac={t['selective_ac_option']}" if t["selective_ac_option"] else ",".join(t["recompute_modules"])
    return f"selective[{what}]"


def _framework_line(t: dict, applied: tuple) -> list:
    """The framework profile and the defaults it filled in (none without a ``framework``)."""
    if not t.get("framework"):
        return []
    filled = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in applied)
    return [f"framework {t['framework']} {t['framework_version']}: profile defaults applied: "
            + (filled or "none (the config sets every key the profile has)")]


def _report(r, applied: tuple = (), experts: list = ()) -> str:
    cfg = r.config
    t, c, m = cfg["training"], cfg["cluster"], cfg["model"]
    lines = [
        f"model {m['name']}  on {c['num_gpus']} x {c['gpu']} ({c['name']}: {c['gpus_per_node']} GPUs/node, "
        f"{c['nics_per_node']} x {c['nic_gbps']:g} Gb/s NICs)",
        f"layout tp={t['tensor_model_parallel_size']} pp={t['pipeline_model_parallel_size']} "
        f"vpp={t['virtual_pipeline_model_parallel_size']} dp={t['data_parallel_size']} "
        f"cp={t['context_parallel_size']} ep={t['expert_model_parallel_size']} sp={int(t['sequence_parallel'])}  mbs={t['micro_batch_size']} "
        f"gbs={t['global_batch_size']} seq={t['seq_length']}  recompute={_recompute_label(t)} "
        f"precision={t['precision']} schedule={t['pipeline_schedule']} kernels={t['kernel_fusion']}",
        *_framework_line(t, applied),
        *([f"pipeline layout {t['pipeline_model_parallel_layout']} (E embedding, t layer, m MTP layer, L loss; "
           "| between virtual stages)"] if t.get("pipeline_model_parallel_layout") else []),
        *experts,
        "",
        f"step time        {r.step_time_s:10.4f} s",
        f"tokens/s         {r.tokens_per_s:10.4g}",
        f"TFLOP/s per GPU  {r.tflops_per_gpu:10.1f}   (model FLOPs: 6*N*tokens + causal attention)",
        f"MFU              {100 * r.mfu:10.1f} %  (vs dense {r.peak_flop_per_s / 1e12:.0f} TFLOP/s 16-bit peak)",
        f"HFU              {100 * r.hfu:10.1f} %  (with recompute)",
        f"memory per GPU   {r.memory_gb_per_gpu:10.1f} GB of {r.memory_capacity_bytes / 1e9:.0f} GB"
        + ("" if r.fits_memory else "   DOES NOT FIT"),
        "",
    ]
    rows = [dict(stage=s.stage, compute=s.compute_s, tp=s.tp_comm_s, cp=s.cp_comm_s, ep=s.ep_comm_s, pp=s.pp_comm_s,
                 dp=s.dp_comm_s, bubble=s.bubble_s, opt=s.optimizer_s, mem=s.memory_bytes / 1e9)
             for s in r.stages]
    cols = [("stage", "stage", "d"), ("compute", "compute s", ".3f"), ("tp", "TP comm s", ".3f"),
            ("cp", "CP comm s", ".3f"), ("ep", "EP comm s", ".3f"), ("pp", "PP comm s", ".3f"), ("dp", "DP comm s", ".3f"),
            ("bubble", "bubble s", ".3f"), ("opt", "optimizer s", ".3f"), ("mem", "memory GB", ".1f")]
    if len(rows) > 8:
        rows = rows[:2] + rows[-2:]
        lines.append("(first and last two pipeline stages; --json for all)")
    lines.append(format_table(rows, cols))
    lines.append("")
    crow = [dict(group=x.group, op=x.op, size=x.size_bytes / 2**20, n=x.n_ranks, algo=f"{x.algo}/{x.proto}",
                 t=x.time_s * 1e3, count=x.count_per_step) for x in r.collectives]
    if crow:
        lines.append(format_table(crow, [("group", "group", ""), ("op", "collective", ""),
                                         ("size", "size MiB", ".2f"), ("n", "ranks", "d"),
                                         ("algo", "NCCL algo/proto", ""), ("t", "time ms", ".3f"),
                                         ("count", "calls/step", "d")]))
    return "\n".join(lines)


COMPONENTS = (("compute_s", "compute"), ("tp_comm_s", "TP communication"), ("cp_comm_s", "CP communication"),
              ("ep_comm_s", "EP communication"), ("pp_comm_s", "PP communication"),
              ("dp_comm_s", "DP communication"), ("bubble_s", "pipeline bubble"), ("optimizer_s", "optimizer"))


def _where(r, top: int = 12) -> dict:
    """``--breakdown``: the critical stage's seconds per step by component, its compute by kind and its
    ``top`` kernels (:mod:`flowsim.export.breakdown`)."""
    from flowsim.export.breakdown import compute_by_kind, kernel_seconds

    b = r.breakdown()
    k = kernel_seconds(r, b["stage"]).head(top)
    return {"stage": b["stage"], "components_s": {name: b[key] for key, name in COMPONENTS if b[key] > 0},
            "compute_by_kind_s": compute_by_kind(r, b["stage"]),
            "top_kernels": k[["block", "name", "kind", "phase", "runs", "time_s", "total_s"]].to_dict("records")}


def _where_report(w: dict, step_s: float) -> str:
    comp = [dict(what=k, s=v, share=100 * v / step_s) for k, v in w["components_s"].items()]
    comp += [dict(what=f"  compute: {k}", s=v, share=100 * v / step_s) for k, v in w["compute_by_kind_s"].items()]
    kern = [dict(block=x["block"], name=x["name"], phase=x["phase"], runs=x["runs"], t=x["time_s"] * 1e6,
                 total=x["total_s"], share=100 * x["total_s"] / step_s) for x in w["top_kernels"]]
    return "\n".join([
        "", "", f"where the time goes (stage {w['stage']}, the slowest; seconds per step)",
        format_table(comp, [("what", "component", ""), ("s", "seconds", ".3f"), ("share", "% of step", ".1f")]),
        "", f"top {len(kern)} kernels of that stage",
        format_table(kern, [("block", "block", ""), ("name", "kernel", ""), ("phase", "phase", ""),
                            ("runs", "runs/step", "d"), ("t", "us each", ".1f"), ("total", "seconds", ".3f"),
                            ("share", "% of step", ".1f")])])


@click.command()
@click.argument("config", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--model", help=f"Model preset ({', '.join(list_presets('models'))}).")
@click.option("--cluster", help=f"Cluster preset ({', '.join(list_presets('clusters'))}).")
@click.option("--gpu", help="GPU key (see `flowsim gpus`) or a GPU spec YAML file.")
@click.option("--gpus", "num_gpus", type=POS_INT, help="GPUs in the job.")
@click.option("--gpus-per-node", type=POS_INT, help="GPUs per host.")
@click.option("--nics-per-node", type=POS_INT, help="Scale-out NICs per host.")
@click.option("--nic-gbps", type=click.FloatRange(min=0, min_open=True), help="Line rate of one NIC, Gb/s.")
@click.option("--tp", type=POS_INT, help="Tensor-parallel size.")
@click.option("--pp", type=POS_INT, help="Pipeline-parallel size.")
@click.option("--vpp", type=POS_INT, help="Model chunks per pipeline rank (interleaved 1F1B when > 1).")
@click.option("--dp", type=POS_INT, help="Data-parallel size (default: GPUs / (tp*pp*cp)).")
@click.option("--cp", type=POS_INT, help="Context-parallel size.")
@click.option("--ep", type=POS_INT, help="Expert-parallel size (MoE models).")
@click.option("--sp/--no-sp", default=None, help="Sequence parallelism with TP.")
@click.option("--mbs", type=POS_INT, help="Micro-batch size (sequences).")
@click.option("--gbs", type=POS_INT, help="Global batch size (sequences per step).")
@click.option("--seq", type=POS_INT, help="Sequence length (tokens).")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), help="Activation recompute.")
@click.option("--distributed-optimizer/--no-distributed-optimizer", default=None,
              help="Megatron distributed optimizer (ZeRO-1).")
@click.option("--zero-stage", type=click.IntRange(0, 3), help="ZeRO stage (3 = FSDP full shard).")
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "nvfp4", "mxfp4"]), help="GEMM precision.")
@click.option("--calibration", metavar="PROFILE",
              help="Calibration profile of the kernel pricing: `default` (the shipped one, the default), a file from "
                   "`flowsim calibrate`, or `none`.")
@click.option("--schedule", type=click.Choice(list(SCHEDULES)), help="Pipeline schedule.")
@click.option("--comm-engine", type=click.Choice(["analytic", "flow"]),
              help="analytic: NCCL's model per communicator; flow: DP/EP/CP/PP collectives as flows on the "
                   "topology, all groups of a stage at once (sees NIC, rail and spine contention).")
@click.option("--kernel-fusion", type=click.Choice(["fused", "eager"]),
              help="fused: Megatron-LM/Transformer Engine kernels; eager: plain PyTorch without torch.compile "
                   "(every elementwise op a kernel of its own).")
@click.option("--framework", help="Training framework whose release defaults fill the keys not given (megatron-lm, "
                                  "megatron-core/nemo/megatron-bridge, megatron-deepspeed, deepspeed, torchtitan, "
                                  "pytorch-fsdp, llm-foundry; docs/MODEL.md 7a).")
@click.option("--framework-version", "framework_version", help="Its release (default: the newest flowsim lists).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help=f"Any other config key (Megatron-LM names; aliases: {', '.join(sorted(ALIASES))}).")
@click.option("--megatron-args", "megatron_args", type=click.Path(exists=True, dir_okay=False),
              help="A Megatron-LM pretrain_gpt.py argument list (shell words; a torchrun prefix gives the GPUs).")
@click.option("--nemo", "nemo_recipe", type=click.Path(exists=True, dir_okay=False),
              help="A NeMo 2 (trainer:/model:) or Megatron-Bridge (model:/train:/ddp:) recipe YAML.")
@click.option("--hf-config", "hf_config", type=click.Path(exists=True, dir_okay=False),
              help="A Hugging Face config.json for the model (Llama, Mistral, Mixtral, Qwen3, DeepSeek, GPT-2).")
@click.option("--workload", "workload_path", type=click.Path(exists=True, dir_okay=False),
              help="Simulate a captured workload (flowsim capture) on --cluster [--gpu] instead of a model.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--breakdown", "show_breakdown", is_flag=True,
              help="Also print where the slowest stage's time goes: components, compute by kernel kind, top kernels "
                   "(with --json: a \"where\" object).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True),
              help="Write a Chrome/Perfetto trace of the step to this file.")
@click.option("--chakra", "chakra_dir", type=click.Path(file_okay=False),
              help="Write Chakra execution traces (protobuf .et, one per rank, and comm_groups.json) into this "
                   "directory, for ASTRA-sim.")
@click.option("--chakra-ranks", metavar="RANKS", help="Only these ranks' traces, e.g. 0,8,16-31 (default: all).")
@user_errors
def estimate(config, model, cluster, gpu, num_gpus, gpus_per_node, nics_per_node, nic_gbps, tp, pp, vpp, dp,
             cp, ep, sp, mbs, gbs, seq, recompute, distributed_optimizer, zero_stage, precision, calibration, schedule,
             sets,
             comm_engine, kernel_fusion, framework, framework_version, megatron_args, nemo_recipe, hf_config,
             workload_path, as_json, show_breakdown, trace_path, chakra_dir, chakra_ranks):
    """Predict step time, throughput, MFU and memory of one training step.

    CONFIG is an optional YAML/JSON file; flags override it. --megatron-args, --nemo and --hf-config read
    another framework's file first (CONFIG and flags override it); values they take from the model family
    rather than the file, and what they ignore, are printed on stderr. Example:

        flowsim estimate --model gpt3-175b --cluster dgx-h100 --gpus 1024 --tp 8 --pp 8 --gbs 1536 --sp

    Exit codes: 0 success (also when the config does not fit in memory: see "fits_memory"),
    2 bad input.
    """
    overrides = dict(model=model, cluster=cluster, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                     nics_per_node=nics_per_node, nic_gbps=nic_gbps, tp=tp, pp=pp, vpp=vpp, dp=dp, cp=cp, ep=ep,
                     sp=sp, mbs=mbs, gbs=gbs, seq=seq, recompute=recompute,
                     use_distributed_optimizer=distributed_optimizer, zero_stage=zero_stage,
                     precision=precision, pipeline_schedule=schedule, comm_engine=comm_engine,
                     kernel_fusion=kernel_fusion, calibration=calibration, framework=framework,
                     framework_version=framework_version)
    overrides.update(_parse_set(sets))
    if workload_path:
        extra = sorted(k for k, v in overrides.items() if v is not None and k not in ("cluster", "gpu"))
        if config or extra or trace_path or chakra_dir or show_breakdown or megatron_args or nemo_recipe or hf_config:
            raise ConfigError("--workload", "takes only --cluster, --gpu and --json (the model and layout come "
                                            "from the captured file)", ", ".join(extra) or "a config or trace option")
        _estimate_workload(workload_path, cluster, gpu, as_json)
        return
    from flowsim._jit import interpret

    interpreted = interpret()  # one simulation: the step core's loops run in the interpreter (flowsim._jit)
    from flowsim.config import build_config
    from flowsim.step.simulate import simulate

    imported = _imported(megatron_args, nemo_recipe, hf_config)
    if trace_path:
        check_output_file(trace_path, "--trace")
    if chakra_dir:
        check_output_dir(chakra_dir, "--chakra")
    cfg = build_config(imported, config, **overrides)
    if not interpreted or cfg.training.comm_engine == "flow":  # the flow engine's loops always compile
        notice_first_compile()
    if not imported:
        _note_unstated(config, overrides)
    result = simulate(cfg)  # checked against the invariants (flowsim.step.invariants)
    if trace_path:
        from flowsim.export.trace import write_chrome_trace

        write_chrome_trace(result, trace_path)
    if chakra_dir:
        from flowsim.export.chakra import write_chakra

        write_chakra(result, chakra_dir, ranks=chakra_ranks)
    where = _where(result) if show_breakdown else None
    if as_json:
        echo_json(estimate_document(cfg, result, where))
    else:
        click.echo(_report(result, cfg.framework_defaults, expert_lines(cfg))
                   + (_where_report(where, result.step_time_s) if where else ""))


def estimate_document(cfg, result, where: dict | None = None) -> dict:
    """What ``flowsim estimate --json`` prints, and the service's ``POST /v1/estimate`` returns: the output
    contract's ``schema_version`` and ``flowsim_version``, :meth:`flowsim.Result.to_dict`, memory in bytes, the
    framework profile's defaults when a framework is set, and ``where`` (``--breakdown``) when given."""
    from flowsim._version import __version__
    from flowsim.cli.common import OUTPUT_SCHEMA_VERSION

    applied = {"framework_defaults": dict(cfg.framework_defaults)} if cfg.training.framework else {}
    return {"schema_version": OUTPUT_SCHEMA_VERSION, "flowsim_version": __version__, **result.to_dict(),
            "memory_bytes_per_gpu": result.memory_bytes_per_gpu, "memory_capacity_bytes": result.memory_capacity_bytes,
            **applied, **({"where": where} if where else {})}


def _imported(megatron_args, nemo_recipe, hf_config) -> dict | None:
    """The config mapping of the one imported file given (its notes printed on stderr), or None."""
    given = [(flag, path) for flag, path in (("--megatron-args", megatron_args), ("--nemo", nemo_recipe),
                                            ("--hf-config", hf_config)) if path]
    if not given:
        return None
    if len(given) > 1:
        raise ConfigError(given[1][0], "give only one of --megatron-args, --nemo, --hf-config", given[0][0])
    from flowsim.config import importers

    flag, path = given[0]
    read = {"--megatron-args": importers.from_megatron_args, "--nemo": importers.from_nemo,
            "--hf-config": importers.from_hf_config}[flag]
    imp = read(path)
    for line in imp.notes():
        click.echo(f"note: {line}", err=True)
    return imp.config


def _note_unstated(config, overrides: dict) -> None:
    """Name on stderr the architecture fields a hand-written model takes from flowsim's GPT-style defaults."""
    from flowsim.config import read_config_file
    from flowsim.config.importers.common import unstated_architecture

    unstated = unstated_architecture(read_config_file(config) if config else {}, overrides)
    if unstated:
        used = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in unstated.items())
        click.echo(f"note: the model does not set {', '.join(unstated)}; used flowsim's defaults (GPT-3 style): "
                   f"{used}", err=True)


def _estimate_workload(path, cluster, gpu, as_json) -> None:
    """``--workload``: price a captured workload (see :func:`flowsim.capture.program.simulate_workload`)."""
    from flowsim.capture.program import simulate_workload

    if not cluster:
        raise ConfigError("--cluster", "is required with --workload", None)
    r = simulate_workload(path, cluster, gpu=gpu)
    pipe = r.pipeline
    if as_json:
        echo_json({"step_time_s": r.step_time_s, "compute_s": r.compute_s, "comm_s": r.comm_s,
                   "exposed_comm_s": r.exposed_comm_s, "bubble_s": r.bubble_s,
                   "pipeline": None if pipe is None else {
                       "stages": len(pipe.fwd_s), "microbatches": pipe.microbatches, "schedule": pipe.schedule,
                       "fwd_s": pipe.fwd_s.tolist(), "bwd_s": pipe.bwd_s.tolist(), "tail_s": pipe.tail_s.tolist(),
                       "p2p_s": pipe.p2p_s, "p2p_bytes": pipe.p2p_bytes, "critical_stage": pipe.critical_stage},
                   "collectives": r.collectives.to_dict("records")})
        return
    lines = [f"step time        {r.step_time_s * 1e3:10.3f} ms",
             f"compute          {r.compute_s * 1e3:10.3f} ms",
             f"exposed comm     {r.exposed_comm_s * 1e3:10.3f} ms  (incl. slowdown of overlapped compute)"]
    if pipe is not None:
        lines.append(f"pipeline bubble  {r.bubble_s * 1e3:10.3f} ms  ({len(pipe.fwd_s)} stages, {pipe.microbatches} "
                     f"micro-batches, {pipe.schedule}; critical stage {pipe.critical_stage})")
    lines.append("")
    if len(r.collectives):
        rows = [dict(op=x.op, size=x.size_bytes / 2**20, n=x.n_ranks, algo=f"{x.algo}/{x.proto}", t=x.time_s * 1e3,
                     count=x.count_per_step) for x in r.collectives.itertuples()]
        lines.append(format_table(rows, [("op", "collective", ""), ("size", "size MiB", ".3f"), ("n", "ranks", "d"),
                                         ("algo", "NCCL algo/proto", ""), ("t", "time ms", ".3f"),
                                         ("count", "calls/step", "d")]))
    click.echo("\n".join(lines))
