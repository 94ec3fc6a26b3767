"""NCCL environment variables a run states (log header or env lines), as the model applies them.

NCCL reads these at communicator init (NCCL 2.30.7 ``src/misc/param.cc``, ``src/init.cc``; the NCCL
environment documentation):

* ``NCCL_ALGO`` / ``NCCL_PROTO``: the algorithm / protocol lists (:mod:`.overrides` syntax); a value given by
  the caller (``--algo``) wins over the run's.
* ``NCCL_NVLS_ENABLE=0``: no NVLink SHARP: NVLS and NVLSTree are left out (NCCL skips NVLS setup, so neither
  is in its cost table).
* ``NCCL_COLLNET_ENABLE=1``: IB SHARP through the CollNet plugin: CollNetDirect / CollNetChain (and NVLS
  across nodes, NVLS + SHARP) become available (``CommLayout.collnet``).
* ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS`` (also spelt ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS``): bounds on
  the channels (CTAs) a collective runs on (``CommLayout.min_ctas`` / ``max_ctas``, :mod:`.graph`).
* ``NCCL_NET_GDR_C2C``: GPUDirect RDMA over the Grace C2C link. Read and reported, no effect: the GPU specs of
  Grace systems (GB200, GB300) already price the GPU-NIC path at the C2C link (``pcie_GBps: 450``), which is
  what ``=1`` gives; the cost of ``=0`` (staging through host memory) has no measurement in shared/.

Other variables are ignored (listed as such by :func:`NcclEnv.from_mapping`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from flowsim.errors import ConfigError
from flowsim.nccl_models.constants import ALGO_NAMES, Algo
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.overrides import parse_override

_NVLS = frozenset({Algo.NVLS, Algo.NVLS_TREE})


def _flag(name: str, text: str) -> bool:
    if text.strip() not in ("0", "1"):
        raise ConfigError(name, "must be 0 or 1", text)
    return text.strip() == "1"


def _count(name: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise ConfigError(name, "must be a positive integer", text)
    return v


@dataclass(frozen=True)
class NcclEnv:
    """The NCCL environment of one run; None where the run does not set a variable.

    Attributes
    ----------
    algo, proto : str or None
        ``NCCL_ALGO``, ``NCCL_PROTO`` text.
    nvls_enable, collnet_enable, net_gdr_c2c : bool or None
        ``NCCL_NVLS_ENABLE``, ``NCCL_COLLNET_ENABLE``, ``NCCL_NET_GDR_C2C``.
    min_ctas, max_ctas : int or None
        ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS`` (or the ``*_NCHANNELS`` spelling).
    ignored : tuple[str, ...]
        Other ``NCCL_*`` variables the run set (not modelled).
    """

    algo: str | None = None
    proto: str | None = None
    nvls_enable: bool | None = None
    collnet_enable: bool | None = None
    min_ctas: int | None = None
    max_ctas: int | None = None
    net_gdr_c2c: bool | None = None
    ignored: tuple = ()

    @classmethod
    def from_mapping(cls, env: dict) -> NcclEnv:
        """Read ``{"NCCL_ALGO": "ring", ...}``; a bad value raises ConfigError naming the variable."""
        kw, ignored = {}, []
        for name, text in env.items():
            if name == "NCCL_ALGO":
                kw["algo"] = text
            elif name == "NCCL_PROTO":
                kw["proto"] = text
            elif name == "NCCL_NVLS_ENABLE":
                kw["nvls_enable"] = _flag(name, text)
            elif name == "NCCL_COLLNET_ENABLE":
                kw["collnet_enable"] = _flag(name, text)
            elif name == "NCCL_NET_GDR_C2C":
                kw["net_gdr_c2c"] = _flag(name, text)
            elif name in ("NCCL_MIN_CTAS", "NCCL_MIN_NCHANNELS"):
                kw["min_ctas"] = _count(name, text)
            elif name in ("NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS"):
                kw["max_ctas"] = _count(name, text)
            else:
                ignored.append(name)
        if kw.get("min_ctas") and kw.get("max_ctas") and kw["min_ctas"] > kw["max_ctas"]:
            raise ConfigError("NCCL_MIN_CTAS", "must not exceed NCCL_MAX_CTAS",
                              f"{kw['min_ctas']} > {kw['max_ctas']}")
        return cls(**kw, ignored=tuple(sorted(ignored)))

    def to_dict(self) -> dict:
        """The variables set, by NCCL name (what ``--json`` prints), plus ``ignored``."""
        names = {"algo": "NCCL_ALGO", "proto": "NCCL_PROTO", "nvls_enable": "NCCL_NVLS_ENABLE",
                 "collnet_enable": "NCCL_COLLNET_ENABLE", "min_ctas": "NCCL_MIN_CTAS", "max_ctas": "NCCL_MAX_CTAS",
                 "net_gdr_c2c": "NCCL_NET_GDR_C2C"}
        out = {names[k]: (int(v) if isinstance(v, bool) else v) for k, v in self.__dict__.items()
               if k in names and v is not None}
        return {**out, "ignored": list(self.ignored)}

    def layout(self, layout: CommLayout) -> CommLayout:
        """``layout`` with the run's CollNet and CTA settings (NVLS goes through :meth:`algo_for`)."""
        kw = {}
        if self.collnet_enable is not None:
            kw["collnet"] = self.collnet_enable
        if self.min_ctas is not None:
            kw["min_ctas"] = self.min_ctas
        if self.max_ctas is not None:
            kw["max_ctas"] = self.max_ctas
        return replace(layout, **kw) if kw else layout

    def algo_for(self, op: str, algo: str | None = None) -> str | None:
        """The NCCL_ALGO text to run ``op`` with: ``algo`` (the caller's) else the run's, less NVLS and
        NVLSTree when ``NCCL_NVLS_ENABLE=0``; None when nothing is restricted."""
        text = algo or self.algo
        if self.nvls_enable is not False or op not in ("allreduce", "allgather", "reducescatter", "broadcast",
                                                      "reduce"):
            return text
        allowed = (parse_override(text, op, "algo") if text else frozenset(Algo)) - _NVLS
        if not allowed:
            raise ConfigError("NCCL_NVLS_ENABLE", "is 0 but NCCL_ALGO allows only NVLS algorithms", text)
        return ",".join(sorted(ALGO_NAMES[a].lower() for a in allowed))

    def proto_for(self, proto: str | None = None) -> str | None:
        """The NCCL_PROTO text: ``proto`` (the caller's) else the run's."""
        return proto or self.proto
