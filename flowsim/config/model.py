"""Transformer model description (Megatron-LM argument names)."""
from __future__ import annotations

from dataclasses import dataclass

from flowsim.config import bounds
from flowsim.errors import ConfigError, check_ints

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "none")
ACTIVATIONS = ("gelu", "swiglu", "squared_relu", "geglu")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer.

    Attributes
    ----------
    num_layers : int
        Transformer layers.
    hidden_size : int
        Model width h.
    ffn_hidden_size : int
        MLP intermediate width (per gate branch for gated MLPs).
    num_attention_heads : int
        Query heads a.
    num_query_groups : int
        Key/value heads g (= a for multi-head attention, < a for GQA).
    kv_channels : int
        Per-head dimension (default h / a).
    vocab_size : int
        Vocabulary (after any padding the framework applies).
    seq_length : int
        Default training sequence length in tokens (a training config may override it).
    activation : str
        ``gelu`` (GPT), ``swiglu`` (Llama), ``squared_relu`` (Nemotron), ``geglu``.
    normalization : str
        ``layernorm`` or ``rmsnorm``.
    position_embedding : str
        ``learned`` (a table of ``max_position_embeddings`` x h), ``rope`` or ``none``.
    untie_embeddings_and_output_weights : bool
        Separate input embedding and LM head matrices.
    add_bias_linear : bool
        Linear layers carry biases (GPT-2/3 style).
    num_moe_experts : int
        Routed experts per MoE layer (0 = dense model).
    moe_router_topk : int
        Experts each token is routed to.
    moe_ffn_hidden_size : int
        Intermediate width of one expert (default ``ffn_hidden_size``).
    moe_shared_expert_intermediate_size : int
        Total intermediate width of the shared experts (0 = none).
    moe_layer_freq : int
        Every ``moe_layer_freq``-th layer is MoE (Megatron-LM ``--moe-layer-freq``), after
        ``moe_first_k_dense`` leading dense layers (DeepSeek-V3 ``first_k_dense_replace``).
    moe_first_k_dense : int
        Leading layers that keep a dense MLP.
    moe_expert_capacity_factor : float
        Token-drop routing (Megatron-LM ``--moe-expert-capacity-factor``): each rank sends an expert at most
        ``ceil(tokens * topk / experts * factor)`` of its tokens and drops the rest. 0 (default): dropless.
    moe_pad_expert_input_to_capacity : bool
        Pad every expert's input from each rank up to that capacity (Megatron-LM
        ``--moe-pad-expert-input-to-capacity``), so expert GEMMs and dispatch have fixed sizes.
    moe_router_num_groups, moe_router_group_topk : int
        Group-limited routing (Megatron-LM ``--moe-router-num-groups`` / ``--moe-router-group-topk``; DeepSeek-V3
        ``n_group`` 8 / ``topk_group`` 4, "each token is sent to at most 4 nodes", arXiv 2412.19437 sec. 3.2.2):
        the experts form this many equal groups and a token picks its experts inside ``group_topk`` of them.
        0 (default): no group limit.
    moe_imbalance_factor : float
        Tokens of the busiest expert-parallel rank over the mean (>= 1; 1 = perfectly even routing). 0 (default):
        modelled (:func:`flowsim.model.moe.imbalance_factor`). The capacity factor bounds it.
    mtp_num_layers : int
        Multi-token prediction depth (Megatron-LM ``--mtp-num-layers``; DeepSeek-V3 trains with 1, arXiv
        2412.19437 sec. 2.2): each MTP module on the last pipeline stage normalises the hidden states and the
        embedding of the next token, projects their concatenation (``2h -> h``), runs one more transformer
        layer of the decoder's last kind (an MoE layer in DeepSeek-V3) and the shared output head with its
        cross-entropy. 0 (default): none.
    multi_latent_attention : bool
        DeepSeek multi-head latent attention (MLA) with ``q_lora_rank``, ``kv_lora_rank``, ``qk_head_dim``,
        ``qk_pos_emb_head_dim`` and ``v_head_dim`` (Megatron-LM argument names; ``q_lora_rank`` 0 means no
        query compression). Its query and key-value latents are normalised (DeepSeek-V2 arXiv 2405.04434 / HF
        ``modeling_deepseek`` ``q_a_layernorm``, ``kv_a_layernorm``).
    qk_layernorm : bool
        Normalise each head's queries and keys before attention (Megatron-LM ``--qk-layernorm``; Qwen3's
        ``q_norm`` / ``k_norm``, HF ``modeling_qwen3``): one more norm kernel over the Q and K heads each way.
    window_size : int
        Sliding-window attention (Megatron-LM ``--window-size W,0``): each query attends to itself and the ``W``
        tokens before it. 0 (default): full causal attention.
    window_attn_skip_freq : int
        With a window, one full-attention layer after every ``N - 1`` windowed ones (Megatron-LM
        ``--window-attn-skip-freq N``; GPT-OSS alternates, N = 2). 0 (default): every layer windowed.
    activation_func_clamp_value : float
        Clamped gated activation (Megatron-core ``activation_func_clamp_value``; GPT-OSS clamps its SwiGLU at 7,
        Megatron-Bridge ``GPTOSSProvider``): the gate half is clamped from above, the linear half to
        ``[-v, v]`` before the activation, which in Megatron-core's routed experts costs kernels of their own
        (:func:`flowsim.model.moe.clamp_rows`). 0 (default): no clamp.
    hidden_dropout : float
        Dropout probability after attention and MLP (Megatron ``--hidden-dropout``); > 0 adds the dropout
        kernels and their 1-byte masks to memory.
    attention_dropout : float
        Dropout probability on the attention probabilities (Megatron ``--attention-dropout``); > 0 adds, with
        unfused attention, a dropout kernel over the ``s x s`` scores and its 1-byte mask (FlashAttention
        draws the mask inside its kernels and keeps none).
    name : str
        Preset name, for display.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int = 0
    num_query_groups: int = 0
    kv_channels: int = 0
    vocab_size: int = 50257
    seq_length: int = 2048
    activation: str = "gelu"
    normalization: str = "layernorm"
    position_embedding: str = "learned"
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    num_moe_experts: int = 0
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    moe_layer_freq: int = 1
    moe_first_k_dense: int = 0
    moe_expert_capacity_factor: float = 0.0
    moe_pad_expert_input_to_capacity: bool = False
    moe_imbalance_factor: float = 0.0
    moe_router_num_groups: int = 0
    moe_router_group_topk: int = 0
    mtp_num_layers: int = 0
    multi_latent_attention: bool = False
    qk_layernorm: bool = False
    window_size: int = 0
    window_attn_skip_freq: int = 0
    activation_func_clamp_value: float = 0.0
    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    name: str = "custom"

    def __post_init__(self):
        if not self.ffn_hidden_size and isinstance(self.hidden_size, int):
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if not self.moe_ffn_hidden_size and isinstance(self.ffn_hidden_size, int):
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        if not self.num_query_groups and isinstance(self.num_attention_heads, int):
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if (not self.kv_channels and isinstance(self.hidden_size, int)
                and isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0):
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)

    @property
    def is_moe(self) -> bool:
        """True when some layers route tokens to experts."""
        return self.num_moe_experts > 0

    def moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has a routed-expert MLP."""
        return (self.is_moe and index >= self.moe_first_k_dense
                and (index - self.moe_first_k_dense) % self.moe_layer_freq == 0)

    @property
    def gated(self) -> bool:
        """True for gated MLPs (SwiGLU/GeGLU): the first MLP GEMM is 2 x ffn wide."""
        return self.activation in ("swiglu", "geglu")

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        self._validate_sizes()
        check_ints(self, ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                     "num_query_groups", "kv_channels", "vocab_size", "seq_length"), 1)
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError("num_query_groups", "must divide num_attention_heads",
                              f"{self.num_query_groups} and {self.num_attention_heads}")
        check_ints(self, ("num_moe_experts", "moe_shared_expert_intermediate_size", "moe_first_k_dense", "q_lora_rank",
                          "mtp_num_layers", "window_size", "window_attn_skip_freq"), 0)
        if self.window_attn_skip_freq and (self.window_attn_skip_freq < 2 or not self.window_size):
            raise ConfigError("window_attn_skip_freq", "must be 0 (every layer windowed) or >= 2 (one full-attention "
                              "layer every N), with a window_size", self.window_attn_skip_freq)
        if self.window_size and self.multi_latent_attention:
            raise ConfigError("window_size", "sliding-window MLA is not modelled", self.window_size)
        check_ints(self, ("moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq", "kv_lora_rank", "qk_head_dim",
                     "qk_pos_emb_head_dim", "v_head_dim"), 1)
        bounds.check_float("moe_expert_capacity_factor", self.moe_expert_capacity_factor, 0.0,
                           bounds.MAX_CAPACITY_FACTOR,
                           f"must be a finite number in [0, {bounds.MAX_CAPACITY_FACTOR:g}] (0 = dropless)")
        check_ints(self, ("moe_router_num_groups", "moe_router_group_topk"), 0)
        g, gk = self.moe_router_num_groups, self.moe_router_group_topk
        if bool(g) != bool(gk) or (g and (self.num_moe_experts % g or gk > g
                                          or gk * (self.num_moe_experts // g) < self.moe_router_topk)):
            raise ConfigError("moe_router_group_topk", "group-limited routing needs moe_router_num_groups dividing "
                              "num_moe_experts and 1 <= moe_router_group_topk <= moe_router_num_groups, whose "
                              "experts hold at least moe_router_topk", f"groups {g}, group_topk {gk}")
        f = self.moe_imbalance_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (f == 0 or 1 <= f < float("inf")):
            raise ConfigError("moe_imbalance_factor", "must be 0 (modelled) or a finite number >= 1 (busiest "
                              "expert-parallel rank's tokens over the mean)", self.moe_imbalance_factor)
        v = self.activation_func_clamp_value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v == 0 or 0 < v < float("inf")) or \
                (v and not self.gated):
            raise ConfigError("activation_func_clamp_value", "must be 0 (no clamp) or a finite number > 0, with a "
                              "gated activation (swiglu, geglu)", self.activation_func_clamp_value)
        if self.moe_pad_expert_input_to_capacity and not self.moe_expert_capacity_factor:
            raise ConfigError("moe_pad_expert_input_to_capacity", "needs moe_expert_capacity_factor > 0",
                              self.moe_expert_capacity_factor)
        if self.is_moe and self.moe_router_topk > self.num_moe_experts:
            raise ConfigError("moe_router_topk", "must not exceed num_moe_experts",
                              f"{self.moe_router_topk} > {self.num_moe_experts}")
        if not self.is_moe and (self.moe_shared_expert_intermediate_size or self.moe_first_k_dense):
            raise ConfigError("num_moe_experts", "MoE options need a mixture-of-experts model (num_moe_experts > 0)",
                              0)
        for key in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(key, "must be in [0, 1)", getattr(self, key))
        if self.activation not in ACTIVATIONS:
            raise ConfigError("activation", f"must be one of {', '.join(ACTIVATIONS)}", self.activation)
        if self.normalization not in NORMS:
            raise ConfigError("normalization", f"must be one of {', '.join(NORMS)}", self.normalization)
        if self.position_embedding not in POSITIONS:
            raise ConfigError("position_embedding", f"must be one of {', '.join(POSITIONS)}",
                              self.position_embedding)
        params = self.num_parameters()
        if params > bounds.MAX_PARAMETERS:
            raise ConfigError("model", f"must have at most {bounds.MAX_PARAMETERS:.3g} parameters (~20x the largest "
                              "published model; keeps the gradient buckets bounded)", f"{params:.3g}")

    def _validate_sizes(self) -> None:
        """Upper bounds on the sizes (:mod:`flowsim.config.bounds` states each limit's reason)."""
        b = bounds
        b.check_int_max(self, ("num_layers",), b.MAX_LAYERS, "~60x the deepest published model")
        b.check_int_max(self, ("hidden_size",), b.MAX_HIDDEN, "10x the widest published model")
        b.check_int_max(self, ("ffn_hidden_size", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"),
                        b.MAX_FFN, "10x the widest published MLP")
        b.check_int_max(self, ("num_attention_heads", "num_query_groups"), b.MAX_HEADS,
                        "25x the most heads of a published model")
        b.check_int_max(self, ("kv_channels", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"), b.MAX_HEAD_DIM,
                        "64x the widest published head")
        b.check_int_max(self, ("q_lora_rank", "kv_lora_rank"), b.MAX_LORA_RANK, "the largest hidden_size")
        b.check_int_max(self, ("vocab_size",), b.MAX_VOCAB, "16x the largest published vocabulary")
        b.check_int_max(self, ("num_moe_experts",), b.MAX_EXPERTS, "40x the most experts of a production model")
        b.check_int_max(self, ("seq_length", "window_size"), b.MAX_SEQ, "16x the longest published training context")
        b.check_int_max(self, ("moe_layer_freq", "moe_first_k_dense", "mtp_num_layers"), b.MAX_LAYERS,
                        "the most layers")

    def full_attention_share(self) -> float:
        """Share of the layers that run full causal attention: 1 without a window, ``1 / N`` with one full layer
        every ``window_attn_skip_freq = N``, 0 when every layer is windowed."""
        if not self.window_size:
            return 1.0
        return 1.0 / self.window_attn_skip_freq if self.window_attn_skip_freq else 0.0

    def attention_weights(self) -> int:
        """Weight-matrix parameters of one attention block (QKV or MLA projections and the output)."""
        h, d, a, g = self.hidden_size, self.kv_channels, self.num_attention_heads, self.num_query_groups
        if self.multi_latent_attention:
            qk = self.qk_head_dim + self.qk_pos_emb_head_dim
            q = h * a * qk if not self.q_lora_rank else h * self.q_lora_rank + self.q_lora_rank * a * qk
            kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank * a * (
                self.qk_head_dim + self.v_head_dim)
            return q + kv + a * self.v_head_dim * h
        return h * d * (a + 2 * g) + a * d * h

    def mlp_weights(self, width: int) -> int:
        """Weight-matrix parameters of one (gated or not) MLP of intermediate width ``width``."""
        return self.hidden_size * width * (2 if self.gated else 1) + width * self.hidden_size

    def moe_layer_count(self) -> int:
        """Layers with routed experts (the decoder's; see :meth:`mtp_moe`): the indices ``i`` of :meth:`moe_layer`,
        ``moe_first_k_dense + j * moe_layer_freq < num_layers``, counted without a loop over the layers."""
        after = self.num_layers - self.moe_first_k_dense
        return -(-after // self.moe_layer_freq) if self.is_moe and after > 0 else 0

    def mtp_moe(self) -> bool:
        """True when the multi-token prediction layers route tokens to experts: they take the decoder's last
        layer kind (Megatron-LM ``get_gpt_mtp_block_spec`` reuses the decoder layer spec)."""
        return self.moe_layer(self.num_layers - 1)

    def num_parameters(self, active: bool = False) -> int:
        """Trainable parameters (embedding and LM head counted once each when untied).

        With ``active`` only the experts a token is routed to count (``moe_router_topk`` per MoE layer).
        """
        h, f, l, v = self.hidden_size, self.ffn_hidden_size, self.num_layers, self.vocab_size
        d, a, g = self.kv_channels, self.num_attention_heads, self.num_query_groups
        norms = 2 * h * (2 if self.normalization == "layernorm" else 1)
        biases = 0
        if self.add_bias_linear:
            biases = d * (a + 2 * g) + h + f * (2 if self.gated else 1) + h
        n_moe = self.moe_layer_count()
        experts = self.moe_router_topk if active else self.num_moe_experts
        moe_mlp = (experts * self.mlp_weights(self.moe_ffn_hidden_size)
                   + self.mlp_weights(self.moe_shared_expert_intermediate_size) + h * self.num_moe_experts)
        layers = l * (self.attention_weights() + norms + biases) + (l - n_moe) * self.mlp_weights(f) + n_moe * moe_mlp
        emb = v * h * (2 if self.untie_embeddings_and_output_weights else 1)
        pos = self.seq_length * h if self.position_embedding == "learned" else 0
        final_norm = h * (2 if self.normalization == "layernorm" else 1)
        # each MTP module: its layer, the 2h -> h projection and three norms (embedding, hidden, final)
        mtp = self.mtp_num_layers * (self.attention_weights() + norms + biases + 2 * h * h + 3 * final_norm
                                     + (moe_mlp if self.mtp_moe() else self.mlp_weights(f)))
        return layers + emb + pos + final_norm + mtp
