"""The drafter's shape: what a checkpoint, an export and the memory model agree on."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# flex_attention's sparse block size: the trainer's block masks and the memory model's
# padded rows (a row that is not whole blocks makes flex keep padded copies) agree on it.
FLEX_BLOCK = 128


def check_attention_shape(cfg, positive: tuple[str, ...]) -> None:
    """Fill head_dim when unset and check what every drafter's attention needs: positive
    sizes (these and `positive`), whole KV groups, an even head_dim for RoPE."""
    if cfg.head_dim is None:
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError(
                f"hidden_size {cfg.hidden_size} is not divisible by num_heads "
                f"{cfg.num_heads}; set head_dim")
        object.__setattr__(cfg, "head_dim", cfg.hidden_size // cfg.num_heads)
    for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", *positive):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"num_heads {cfg.num_heads} is not a multiple of "
                         f"num_kv_heads {cfg.num_kv_heads}")
    if cfg.head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {cfg.head_dim}")


@dataclass(frozen=True)  # presets are shared: derive with dataclasses.replace
class DrafterConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int  # the verifier's full vocabulary
    draft_vocab_size: int
    head_dim: int | None = None  # None: hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0

    def __post_init__(self) -> None:
        check_attention_shape(self, ("intermediate_size", "vocab_size", "draft_vocab_size"))
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} exceeds "
                             f"vocab_size {self.vocab_size}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown drafter config keys: {', '.join(unknown)}")
        return cls(**d)


PRESETS: dict[str, DrafterConfig] = {
    # The CPU demo and tests; the synthetic verifier is built with the same numbers.
    "tiny": DrafterConfig(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=192,
                          vocab_size=512, draft_vocab_size=256, rope_theta=10000.0),
    "llama3-8b": DrafterConfig(hidden_size=4096, num_heads=32, num_kv_heads=8,
                               intermediate_size=14336, vocab_size=128256,
                               draft_vocab_size=32000),
    # Kimi-K2 attends with MLA; its EAGLE-3 drafters are plain Llama layers with full
    # multi-head KV and head_dim 128 (7168 is not a multiple of 128).
    "kimi-k2": DrafterConfig(hidden_size=7168, num_heads=64, num_kv_heads=64, head_dim=128,
                             intermediate_size=18432, vocab_size=163840,
                             draft_vocab_size=32000, rms_norm_eps=1e-6,
                             rope_theta=50000.0),
}


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's shape. It has no embedding or head of its own (it reads the
    verifier's, frozen), so its vocabulary is the verifier's whole one."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int  # the verifier's full vocabulary
    num_layers: int
    num_target_layers: int  # verifier layers concatenated into the context
    block_size: int  # one anchor and block_size - 1 mask tokens
    mask_token_id: int  # a token the verifier's data never holds: it marks what to fill
    head_dim: int | None = None  # None: hidden_size // num_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0

    def __post_init__(self) -> None:
        check_attention_shape(self, ("intermediate_size", "vocab_size", "num_layers",
                                     "num_target_layers", "block_size"))
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the "
                             f"vocabulary of {self.vocab_size}")

    # the same dict round trip as DrafterConfig's
    to_dict = DrafterConfig.to_dict
    from_dict = classmethod(DrafterConfig.from_dict.__func__)


DFLASH_PRESETS: dict[str, DFlashConfig] = {
    # The CPU tests and --synthetic: the synthetic verifier's shape; its data never holds
    # the last token.
    "tiny": DFlashConfig(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=192,
                         vocab_size=512, num_layers=2, num_target_layers=3, block_size=8,
                         mask_token_id=511, rope_theta=10000.0),
    # Qwen3-8B's attention and MLP shape, five draft layers over five verifier layers. Its
    # tokenizer has 151,669 tokens: the mask is the first of the embedding's spare rows.
    "qwen3-8b": DFlashConfig(hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                             intermediate_size=12288, vocab_size=151936, num_layers=5,
                             num_target_layers=5, block_size=16, mask_token_id=151669),
    # The story's verifier: hidden 7168, a 248,320-token vocabulary, block 24. The mask is
    # its last row; --model-config names another where the verifier uses that one.
    "story": DFlashConfig(hidden_size=7168, num_heads=64, num_kv_heads=8, head_dim=128,
                          intermediate_size=18432, vocab_size=248320, num_layers=5,
                          num_target_layers=5, block_size=24, mask_token_id=248319),
}
# The story's training knobs beside its shape: 1,024 anchors a row, a 15 % soft KL, γ 10.
DFLASH_TRAINING_PRESETS: dict[str, dict] = {
    "story": {"max_anchors": 1024, "soft_kl": 0.15, "gamma": 10.0},
}
