"""``flowsim results``: query the results store."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, format_table, user_errors

_COLS = [("study", "study", ""), ("model", "model", ""), ("gpu", "gpu", ""), ("num_gpus", "GPUs", "d"),
         ("nics_per_node", "NICs", "d"), ("nic_gbps", "Gb/s", "g"), ("oversubscription", "oversub", "g"),
         ("tp", "tp", "d"), ("pp", "pp", "d"), ("vpp", "vpp", "d"), ("cp", "cp", "d"), ("ep", "ep", "d"),
         ("dp", "dp", "d"),
         ("mbs", "mbs", "d"), ("recompute", "recompute", ""), ("zero", "zero", "d"),
         ("step_time_s", "step s", ".3f"), ("mfu_pct", "MFU %", ".1f"), ("mem_gb", "mem GB", ".1f")]


@click.command()
@click.option("--db", help="Results database: a local store file (default ~/.cache/flowsim/results.sqlite or "
                            "$FLOWSIM_DB), or a service database URL (sqlite:///PATH, postgresql://...; the service "
                            "extra).")
@click.option("--study", help="Only points of this study (tune runs are stored as 'tune').")
@click.option("--sort", default="step_time_s", show_default=True, help="Column to sort by (ascending).")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, help="Rows (0 = all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {'points': [...]}.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV, every column.")
@user_errors
def results(db, study, sort, limit, as_json, as_csv):
    """List stored design points (every point tune and sweep evaluated)."""
    from flowsim.errors import ConfigError
    from flowsim.explore.store import results_frame

    if db and "://" in db:  # the service's database: its tune and sweep points
        from flowsim.service.store import points_frame

        df = points_frame(db, study)
    else:
        df = results_frame(db, study)
    if len(df):
        if sort not in df.columns:
            raise ConfigError("--sort", f"unknown column; known: {', '.join(df.columns)}", sort)
        df = df.sort_values(sort, kind="stable")
    if limit:
        df = df.head(limit)
    if as_json:
        echo_json({"points": df.to_dict(orient="records")})
    elif as_csv:
        click.echo(df.to_csv(index=False), nl=False)
    elif not len(df):
        click.echo("no stored points")
    else:
        rows = df.to_dict(orient="records")
        for r in rows:
            r.update(mfu_pct=100 * r["mfu"], mem_gb=r["memory_bytes_per_gpu"] / 1e9)
        click.echo(format_table(rows, _COLS))
