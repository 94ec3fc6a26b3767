"""fp8_param_gather: the transformer layers' weights are all-gathered in FP8 (1 byte), the rest stays 16-bit."""
import pytest

from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.workload import build_workload
from flowsim.step.data_parallel import layer_gather_bytes, part_gather_bytes, reduction_parts
from flowsim.config.layout import group_spans
from flowsim import simulate


def _cfg(**kw):
    return build_config(model="llama3-8b", cluster="dgx-h100", gpus=16, dp=16, gbs=64, precision="fp8",
                        distributed_optimizer=True, **kw)


def test_layer_gathers_are_one_byte_per_parameter():
    assert layer_gather_bytes(_cfg().training) == 2.0
    assert layer_gather_bytes(_cfg(fp8_param_gather=True).training) == 1.0


def test_dense_part_keeps_embedding_and_head_16_bit():
    cfg = _cfg(fp8_param_gather=True)
    wl = build_workload(cfg)
    (g, op, n, _), = reduction_parts(cfg.training, wl, group_spans(cfg.training), 0)
    m = cfg.model
    outside = 2 * m.vocab_size * m.hidden_size + m.hidden_size  # untied embedding and LM head, final norm
    assert op == "reducescatter"
    assert part_gather_bytes(cfg, wl, 0, g, n) == pytest.approx((n - outside) * 1 + outside * 2, rel=1e-3)
    plain = _cfg()
    assert part_gather_bytes(plain, build_workload(plain), 0, g, n) == pytest.approx(2 * n)


def test_fp8_gather_shortens_the_exposed_gather():
    base = simulate(_cfg(overlap_param_gather=False))
    fp8 = simulate(_cfg(overlap_param_gather=False, fp8_param_gather=True))
    assert fp8.breakdown()["dp_comm_s"] < base.breakdown()["dp_comm_s"]


def test_needs_fp8_precision():
    with pytest.raises(ConfigError, match="fp8_param_gather: needs precision: fp8"):
        build_config(model="llama3-8b", cluster="dgx-h100", gpus=16, dp=16, gbs=64, fp8_param_gather=True)
