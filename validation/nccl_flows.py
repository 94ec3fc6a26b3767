"""nccl-tests logs against the flow engine (:mod:`flowsim.network.collective_flows`)."""
from __future__ import annotations

from flowsim.config.cluster import ClusterConfig
from flowsim.gpu_specs import GPUSpec
from flowsim.nccl_models import DEFAULT_NCCL_VERSION, P2P_OPS, NcclEnv
from flowsim.network.collective_flows import run_collective
from flowsim.validation.nccl_tests import NcclComparison, summarize

__all__ = ["flow_comparison"]


def flow_comparison(analytic: NcclComparison, cluster: ClusterConfig, gpu: GPUSpec, *, algo: str | None = None,
                    proto: str | None = None, nccl_version: str = DEFAULT_NCCL_VERSION,
                    env: dict | None = None) -> NcclComparison:
    """Redo an nccl-tests comparison with the flow engine, on all GPUs of ``cluster`` as one communicator.

    Parameters
    ----------
    analytic : NcclComparison
        :func:`flowsim.validation.nccl_tests.compare_nccl_tests` of the log (its rows, sections and skipped
        lines are kept; the predictions are replaced).
    cluster : ClusterConfig
        The measured system; every GPU is a rank.
    gpu : GPUSpec
        Its GPU.
    algo, proto : str, optional
        NCCL_ALGO / NCCL_PROTO overrides of the run (ignored for AllToAll and Send/Recv, as in the analytic
        comparison).
    nccl_version : str, optional
        NCCL release whose choice is modelled (the log's, as in the analytic comparison).
    env : dict[int, NcclEnv], optional
        Per section, the NCCL environment of the run (``NcclTestsLog.env``): its NCCL_ALGO / NCCL_PROTO (below
        ``algo`` / ``proto``), NCCL_NVLS_ENABLE and NCCL_COLLNET_ENABLE apply; the CTA bounds do not.

    Returns
    -------
    NcclComparison
        Same rows with ``predicted_time_s``, ``predicted_busbw_Bps``, ``busbw_error``, ``algo``, ``proto``
        from :func:`flowsim.network.collective_flows.run_collective`.
    """
    rows = analytic.rows.copy()
    ranks = list(range(cluster.num_gpus))
    env = env or {}
    results = []
    for section, op, size in zip(rows["section"], rows["op"], rows["size_bytes"]):
        e = env.get(section, NcclEnv())
        p2p = op in P2P_OPS
        results.append(run_collective(cluster, gpu, op, size, ranks, algo=None if p2p else e.algo_for(op, algo),
                                      proto=None if p2p else e.proto_for(proto), nccl_version=nccl_version,
                                      collnet=bool(e.collnet_enable)))
    rows["predicted_time_s"] = [r.time_s for r in results]
    rows["predicted_busbw_Bps"] = [r.busbw_Bps for r in results]
    rows["busbw_error"] = rows["measured_time_s"] / rows["predicted_time_s"] - 1.0
    rows["algo"] = [r.algo for r in results]
    rows["proto"] = [r.proto for r in results]
    return NcclComparison(rows, summarize(rows["size_bytes"], rows["busbw_error"]), analytic.skipped,
                          env=analytic.env)
