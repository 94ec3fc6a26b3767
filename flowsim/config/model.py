"""Transformer model description (Megatron-LM argument names)."""
from __future__ import annotations

from dataclasses import dataclass

from flowsim.errors import ConfigError

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
    hidden_dropout : float
        Dropout probability after attention and MLP (Megatron ``--hidden-dropout``); > 0 adds the dropout
        kernels and their 1-byte masks to memory.
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
    name: str = "custom"

    def __post_init__(self):
        if not self.ffn_hidden_size and isinstance(self.hidden_size, int):
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if not self.num_query_groups and isinstance(self.num_attention_heads, int):
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if (not self.kv_channels and isinstance(self.hidden_size, int)
                and isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0):
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)

    @property
    def gated(self) -> bool:
        """True for gated MLPs (SwiGLU/GeGLU): the first MLP GEMM is 2 x ffn wide."""
        return self.activation in ("swiglu", "geglu")

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                     "num_query_groups", "kv_channels", "vocab_size", "seq_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(name, "must be a positive integer", v)
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError("num_query_groups", "must divide num_attention_heads",
                              f"{self.num_query_groups} and {self.num_attention_heads}")
        if not 0.0 <= self.hidden_dropout < 1.0:
            raise ConfigError("hidden_dropout", "must be in [0, 1)", self.hidden_dropout)
        if self.activation not in ACTIVATIONS:
            raise ConfigError("activation", f"must be one of {', '.join(ACTIVATIONS)}", self.activation)
        if self.normalization not in NORMS:
            raise ConfigError("normalization", f"must be one of {', '.join(NORMS)}", self.normalization)
        if self.position_embedding not in POSITIONS:
            raise ConfigError("position_embedding", f"must be one of {', '.join(POSITIONS)}",
                              self.position_embedding)

    def num_parameters(self) -> int:
        """Total trainable parameters (embedding and LM head counted once each when untied)."""
        h, f, l, v = self.hidden_size, self.ffn_hidden_size, self.num_layers, self.vocab_size
        d, a, g = self.kv_channels, self.num_attention_heads, self.num_query_groups
        attn = h * d * (a + 2 * g) + a * d * h
        mlp = h * f * (2 if self.gated else 1) + f * h
        norms = 2 * h * (2 if self.normalization == "layernorm" else 1)
        biases = 0
        if self.add_bias_linear:
            biases = d * (a + 2 * g) + h + f * (2 if self.gated else 1) + h
        per_layer = attn + mlp + norms + biases
        emb = v * h * (2 if self.untie_embeddings_and_output_weights else 1)
        pos = self.seq_length * h if self.position_embedding == "learned" else 0
        final_norm = h * (2 if self.normalization == "layernorm" else 1)
        return l * per_layer + emb + pos + final_norm
