"""The MoE layer: configuration, weights, prepared weights, forward.

The one place the Python package maps onto the C ABI's layer functions (mxmoe_moe_prepare /
mxmoe_moe_forward), which stand on the library's mxmoe::prepare / mxmoe::moe_forward
(include/mxmoe/forward.h): the CPU backend (cpu::moe_forward, f32) or the CUDA layer.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import struct
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

from . import _lib, _tensor
from ._errors import invalid


@dataclass(frozen=True)
class MoEConfig:
    """What the layer computes (mxmoe::moe_config, include/mxmoe/moe.h).

    x [T, H]; router logits [T, E]; routing -> expert ids and weights [T, top_k]; per selected
    expert e: h = x·W13ₑᵀ (+ b13ₑ) [2I]; a = act(gate, up) [I]; y = a·W2ₑᵀ (+ b2ₑ) [H];
    out = Σ w_k · y_k.

    Attributes:
        experts, hidden, intermediate: E, H, I (H and I multiples of 32, E <= 512).
        routing: ``softmax_topk`` (Mixtral, Qwen3-MoE; ``renormalize`` divides the k weights by
            their sum), ``topk_softmax`` (gpt-oss), ``sigmoid_grouped_topk`` (DeepSeek-V3, Kimi-K2:
            ``n_group``, ``topk_group``, ``routed_scaling_factor``, correction bias).
        top_k: experts per token, in [1, min(16, E)].
        activation: ``silu_mul`` (silu(gate)·up) or ``swiglu_clamped`` (gpt-oss: g = min(gate,
            limit), u = clamp(up, ±limit), g·sigmoid(alpha·g)·(u + 1)).
        gate_up: rows of the fused [2I, H] weight: ``concatenated`` ([gate; up]) or
            ``interleaved`` (gpt-oss: row 2j gate j, row 2j+1 up j).
    """

    experts: int
    hidden: int
    intermediate: int
    routing: str = "softmax_topk"
    top_k: int = 1
    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    activation: str = "silu_mul"
    alpha: float = 1.702
    limit: float = 7.0
    gate_up: str = "concatenated"

    @classmethod
    def from_preset(cls, name: str, *, experts: int | None = None) -> "MoEConfig":
        """The MoE layer of a model mxmoe targets (:func:`mxmoe.presets`, docs/models.md):
        ``"gpt-oss-120b"``, ``"qwen3-30b-a3b"``, ...; ``experts`` replaces E (a smaller layer of
        the same shape and routing)."""
        from ._synthetic import find_preset

        cfg = find_preset(name).config
        return cfg if experts is None else dataclasses.replace(cfg, experts=experts)

    @classmethod
    def _from_c(cls, c: _lib.MoeConfigC) -> "MoEConfig":
        def name(names: tuple[str, ...], value: int, what: str) -> str:
            if not 0 <= value < len(names):
                raise invalid(what, " | ".join(names), str(value))
            return names[value]

        return cls(c.experts, c.hidden, c.intermediate, name(_lib.ROUTING_KINDS, c.routing_kind, "routing"),
                   c.top_k, bool(c.renormalize), c.n_group, c.topk_group, _shortest_f32(c.routed_scaling_factor),
                   name(_lib.ACTIVATION_KINDS, c.activation_kind, "activation"), _shortest_f32(c.alpha),
                   _shortest_f32(c.limit), name(_lib.GATE_UP_ORDERS, c.gate_up_order, "gate_up"))

    def validate(self) -> None:
        """Raises :class:`~mxmoe.InvalidArgument` naming the field (``cfg.routing.top_k``) when the
        library would reject this configuration (mxmoe::validate)."""
        _lib.check(_lib.lib.mxmoe_moe_config_validate(ctypes.byref(self._to_c())))

    def _to_c(self) -> _lib.MoeConfigC:
        return _lib.MoeConfigC(
            self.experts,
            self.hidden,
            self.intermediate,
            _lib.index(_lib.ROUTING_KINDS, self.routing, "cfg.routing.kind"),
            self.top_k,
            int(bool(self.renormalize)),
            self.n_group,
            self.topk_group,
            self.routed_scaling_factor,
            _lib.index(_lib.ACTIVATION_KINDS, self.activation, "cfg.activation.kind"),
            self.alpha,
            self.limit,
            _lib.index(_lib.GATE_UP_ORDERS, self.gate_up, "cfg.gate_up"),
        )


def _shortest_f32(value: float) -> float:
    """The shortest decimal that rounds to the same float32 as ``value`` (1.702, not
    1.7020000219345093): the C struct holds floats, MoEConfig the numbers a user would write."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.unpack("=f", struct.pack("=f", float(text)))[0] == value:
            return float(text)
    return value


def parse_device(device: Any) -> tuple[int, int]:
    """(device type, device id) of ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a torch.device."""
    text = str(device)
    if text == "cpu":
        return _lib.DEVICE_CPU, 0
    if text == "cuda":
        return _lib.DEVICE_CUDA, 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return _lib.DEVICE_CUDA, int(text[5:])
    raise invalid("device", "'cpu', 'cuda' or 'cuda:N'", repr(device))


def device_name(device: tuple[int, int]) -> str:
    return f"cuda:{device[1]}" if device[0] == _lib.DEVICE_CUDA else "cpu"


# Host-memory tensors of the CUDA layer (mxmoe/cuda.h: biases and router tensors).
_HOST_ONLY = ("gate_up_bias", "down_bias", "router_weight", "router_bias", "correction_bias")
# id -> the layer, for torch ops (which name a layer by PreparedMoE.id): a plain dict of weak
# references, read by the extension without calling into Python; an entry goes with its layer.
_live_layers: "dict[int, weakref.ref[PreparedMoE]]" = {}
_layer_ids = itertools.count(1)

CACHED_WORKSPACE_BYTES = 1 << 20
"""The workspace a CUDA layer keeps per stream for the forwards that need at most this much (1
MiB: about T = 22 for gpt-oss's layers, about T = 6 for DeepSeek-V3's). Small forwards are the
ones whose host time matters (a decode step's kernels take microseconds), and allocating their
workspace per call from torch cost ~4 us on the H200 host; a larger forward gets its workspace
from torch's caching allocator for the call, so that no layer holds a prefill's (hundreds of MB
at T = 8192). The kept one is allocated at this size on a stream's first forward, so it never
grows."""


class _DeviceMemory:
    """Device memory the library allocated (mxmoe_device_alloc), freed with its owner: a layer's
    kept workspace. Not torch's: memory a torch caching-allocator pool held would belong to
    whichever pool was active when it was allocated, and torch.compile's CUDA-graph trees count
    every live block of their pool as theirs (their warm-up runs in it, not capturing)."""

    ptr = 0  # until allocated

    def __init__(self, device: int, nbytes: int):
        ptr = ctypes.c_void_p()
        _lib.check(_lib.lib.mxmoe_device_alloc(device, nbytes, ctypes.byref(ptr)))
        self.device, self.ptr = device, ptr.value

    def __del__(self) -> None:
        if _lib.lib is not None and self.ptr:  # None while the interpreter shuts down
            _lib.lib.mxmoe_device_free(self.device, self.ptr)
        self.ptr = 0


# The C++ op library (mxmoe._torchop.NativeOps) once mxmoe.torch has loaded it: every layer is
# registered with it, and it owns their handles (PreparedMoE.close).
native_ops: Any = None


class PreparedMoE(_lib.Owned):
    """MoE weights prepared for one backend; owns their memory (host for the CPU backend, device
    for CUDA) and frees it on :meth:`close`, at the end of a ``with`` block, or when collected.
    A CUDA graph that captured a forward must not outlive the layer."""

    _free = "mxmoe_moe_free"
    _native = None  # the op library that owns the handle (mxmoe._torchop), if it was loaded

    def __init__(self, handle: int, config: MoEConfig | None, device: tuple[int, int]):
        """``config``: what was prepared; None: the library's (a tensor-parallel shard's has
        I = I_r)."""
        self._handle = handle
        if config is None:
            c = _lib.MoeConfigC()
            _lib.check(_lib.lib.mxmoe_moe_config_of(handle, ctypes.byref(c)))
            config = MoEConfig._from_c(c)
        self.config = config
        self._device = device
        self.id = next(_layer_ids)  # how torch ops (mxmoe.torch) name this layer
        self._workspace_bytes: dict[int, int] = {}
        # cudaStream_t (int) -> (_DeviceMemory, its pointer, bytes): the default workspace of small
        # forwards on that stream outside graph capture (hotpath.c, workspace_of; new_workspace).
        self._workspaces: dict[int, tuple[Any, int, int]] = {}
        _live_layers[self.id] = weakref.ref(self, lambda _, layer_id=self.id: _live_layers.pop(layer_id, None))
        if native_ops is not None:
            native_ops.adopt(self)

    def close(self) -> None:
        """Frees the prepared weights and the workspaces kept for forwards (idempotent)."""
        self._workspaces = {}
        native, self._native = self._native, None
        if native is None:
            super().close()
        elif self._handle:  # the op library frees the handle once no forward through it runs
            self._handle = 0
            native.release(self.id)

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return device_name(self._device)

    @property
    def is_cuda(self) -> bool:
        return self._device[0] == _lib.DEVICE_CUDA

    def _live_handle(self) -> int:
        if not self._handle:
            raise invalid("layer", "a prepared layer", "a layer that was closed")
        return self._handle

    @property
    def expert_map(self) -> list[int]:
        """The experts this layer holds (:func:`prepare`'s ``expert_map``); [] for all of them."""
        n = ctypes.c_int64()
        _lib.check(_lib.lib.mxmoe_moe_expert_map(self._live_handle(), None, 0, ctypes.byref(n)))
        held = (ctypes.c_int32 * n.value)()
        _lib.check(_lib.lib.mxmoe_moe_expert_map(self._live_handle(), held, n.value, ctypes.byref(n)))
        return list(held)

    @property
    def weight_bytes(self) -> int:
        """Memory the prepared weights occupy."""
        n = ctypes.c_int64()
        _lib.check(_lib.lib.mxmoe_moe_weight_bytes(self._live_handle(), ctypes.byref(n)))
        return n.value

    def workspace_bytes(self, max_tokens: int) -> int:
        """Bytes of device workspace a forward of up to ``max_tokens`` tokens needs (0 on the CPU)."""
        cached = self._workspace_bytes.get(max_tokens)
        if cached is not None:
            return cached
        n = ctypes.c_int64()
        _lib.check(_lib.lib.mxmoe_moe_workspace_bytes(self._live_handle(), max_tokens, ctypes.byref(n)))
        if len(self._workspace_bytes) < 4096:
            self._workspace_bytes[max_tokens] = n.value
        return n.value

    def read_error_flags(self, workspace: Any) -> int:
        """CUDA: the flags a forward left in ``workspace`` (the one passed to
        :func:`moe_forward`): bit 0 set when a precomputed expert id was outside [0, E) and that
        slot was dropped. Synchronizes. CPU: 0 (host ids are checked before the call)."""
        flags = ctypes.c_uint32()
        ptr, nbytes = (None, 0)
        if self.is_cuda:
            ptr, nbytes, _ = _tensor.buffer(workspace, "workspace")
        _lib.check(_lib.lib.mxmoe_moe_error_flags(self._live_handle(), ptr, nbytes, ctypes.byref(flags)))
        return flags.value

    def __repr__(self) -> str:
        state = "" if self._handle else ", closed"
        return f"PreparedMoE({self.config}, device={self.device!r}{state})"


def prepare(config: MoEConfig, *, device: Any = None, expert_map: Sequence[int] | None = None, tp_rank: int = 0,
            tp_ranks: int = 1, **weights: Any) -> PreparedMoE:
    """Validate and prepare checkpoint-layout MoE weights for the CPU or a CUDA device, all of the
    layer or the part one rank of expert / tensor parallelism holds (docs/parallel.md).

    Weights (keyword arguments; torch, numpy or DLPack arrays):
        MXFP4: ``gate_up_blocks`` u8 [E, 2I, H/32, 16], ``gate_up_scales`` u8 [E, 2I, H/32],
        ``down_blocks`` u8 [E, H, I/32, 16], ``down_scales`` u8 [E, H, I/32] (the gpt-oss
        checkpoint layout; :func:`mxmoe.quantize` output reshaped) — or BF16 (CPU backend only):
        ``gate_up`` bf16 [E, 2I, H], ``down`` bf16 [E, H, I].
        Optional: ``gate_up_bias`` [E, 2I], ``down_bias`` [E, H], ``router_weight`` [E, H],
        ``router_bias`` [E] (bf16 | f32), ``correction_bias`` f32 [E] (sigmoid_grouped_topk).

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; default: where the expert matrices are.
            The CPU backend keeps a copy of the weights; CUDA uploads and repacks them into the
            kernel layout (biases and router tensors are read from host memory: CUDA ones are
            copied to the host first).
        expert_map: expert parallelism: E entries, ``expert_map[e]`` = global expert e's index in
            the weights' expert dimension, -1 for an expert held elsewhere. The expert tensors and
            their biases then hold E_held experts in that order (``w[held]`` of the whole layer's;
            :func:`contiguous_expert_map` gives rank r's map of the contiguous placement); the
            router tensors keep all E. A slot routed to an expert held elsewhere contributes 0.
            Default: every expert.
        tp_rank, tp_ranks: tensor parallelism along I: ``tp_ranks`` > 1 cuts shard ``tp_rank``
            (the 32-blocks of I :func:`shard_intermediate` gives it) out of the given host MXFP4
            weights; the layer's ``config.intermediate`` is then I_r and the shards' outputs sum
            to the layer's (the down bias lives on rank 0).

    Raises :class:`~mxmoe.InvalidArgument` naming ``expert_map``, ``tp.rank``, ``tp.ranks`` or the
    weight that does not fit them.
    """
    first = weights.get("gate_up_blocks" if _is_mxfp4(weights) else "gate_up")
    target = parse_device(device) if device is not None else _tensor.device_of(first)
    cw = weights_c(weights, host_only_to_cpu=target[0] == _lib.DEVICE_CUDA)
    options = prepare_options_c(expert_map, tp_rank, tp_ranks)
    handle = ctypes.c_void_p()
    _lib.check(_lib.lib.mxmoe_moe_prepare_with_options(ctypes.byref(config._to_c()), ctypes.byref(cw),
                                                       ctypes.byref(options), target[0], target[1],
                                                       ctypes.byref(handle)))
    return PreparedMoE(handle.value, None if _sharded(tp_rank, tp_ranks) else config, target)


def prepare_options_c(expert_map: Sequence[int] | None, tp_rank: int, tp_ranks: int) -> _lib.PrepareOptionsC:
    """The mxmoe_prepare_options of :func:`prepare`'s arguments (the struct keeps the map alive)."""
    held = (ctypes.c_int32 * len(expert_map))(*expert_map) if expert_map is not None else None
    options = _lib.PrepareOptionsC(held, len(held) if held is not None else 0, tp_rank, tp_ranks)
    options._held = held
    return options


def _sharded(tp_rank: int, tp_ranks: int) -> bool:
    """Whether the prepared layer is a tensor-parallel shard (its config then comes from the
    library: I = I_r)."""
    return tp_ranks > 1 or tp_rank != 0


def shard_intermediate(intermediate: int, tp_rank: int, tp_ranks: int) -> tuple[int, int]:
    """(first intermediate index, I_r) of tensor-parallel shard ``tp_rank`` of ``tp_ranks`` of a
    layer of I = ``intermediate`` (mxmoe::shard_begin / shard_intermediate: the 32-blocks of I
    split as evenly as they go, the first ranks one more)."""
    begin, size = ctypes.c_int64(), ctypes.c_int64()
    _lib.check(_lib.lib.mxmoe_shard_intermediate(intermediate, tp_rank, tp_ranks, ctypes.byref(begin),
                                                 ctypes.byref(size)))
    return begin.value, size.value


def contiguous_expert_map(experts: int, ranks: int, rank: int) -> list[int]:
    """The expert map (E entries) of ``rank`` when ``experts`` experts are placed contiguously over
    ``ranks`` ranks (mxmoe::contiguous_owners, expert_map_of): the :func:`prepare` argument."""
    held = (ctypes.c_int32 * max(experts, 0))()
    _lib.check(_lib.lib.mxmoe_contiguous_expert_map(experts, ranks, rank, held))
    return list(held)


def _is_mxfp4(weights: dict[str, Any]) -> bool:
    return weights.get("gate_up_blocks") is not None or weights.get("gate_up") is None


def weights_c(weights: dict[str, Any], *, host_only_to_cpu: bool = False, prefix: str = "weights",
              writable: bool = False) -> _lib.MoeWeightsC:
    """The mxmoe_moe_weights of checkpoint-layout tensors by name. The struct keeps their views
    and the host copies it made alive; the caller keeps ``weights`` alive while it uses the struct
    (a view holds only a data pointer). ``host_only_to_cpu``: biases and router tensors on a CUDA
    device are copied to the host (where the CUDA layer reads them)."""
    unknown = sorted(set(weights) - set(_lib.WEIGHT_FIELDS))
    if unknown:
        raise invalid(unknown[0], "one of " + ", ".join(_lib.WEIGHT_FIELDS), "an unknown weight name")
    views, copies = {}, []
    for name in _lib.WEIGHT_FIELDS:
        value = weights.get(name)
        if value is None:
            continue
        if host_only_to_cpu and name in _HOST_ONLY and _tensor.is_torch(value) and value.is_cuda:
            value = value.detach().cpu()
            copies.append(value)
        views[name] = _tensor.view(value, f"{prefix}.{name}", writable=writable)
    struct = _lib.MoeWeightsC(_lib.WEIGHTS_MXFP4 if _is_mxfp4(weights) else _lib.WEIGHTS_BF16,
                              *(views.get(n) for n in _lib.WEIGHT_FIELDS))
    struct._copies = copies
    return struct


def checkpoint_shapes(config: MoEConfig, format: str) -> dict[str, tuple[int, ...]]:
    """The shapes of a layer's tensors in the checkpoint layout (include/mxmoe/moe.h,
    ``moe_weights``) for ``format`` ("mxfp4" | "bf16"), by weight name."""
    e, h, i = config.experts, config.hidden, config.intermediate
    if format == "mxfp4":
        experts = {"gate_up_blocks": (e, 2 * i, h // 32, 16), "gate_up_scales": (e, 2 * i, h // 32),
                   "down_blocks": (e, h, i // 32, 16), "down_scales": (e, h, i // 32)}
    else:
        experts = {"gate_up": (e, 2 * i, h), "down": (e, h, i)}
    return {**experts, "gate_up_bias": (e, 2 * i), "down_bias": (e, h), "router_weight": (e, h),
            "router_bias": (e,), "correction_bias": (e,)}


@dataclass
class MoEWeights:
    """One MoE layer's weights in the checkpoint layout, with its configuration: what
    :func:`mxmoe.synthetic_layer` and :meth:`mxmoe.Checkpoint.read_layer` return (CPU torch
    tensors the object owns) and what :func:`mxmoe.verify` runs the reference on. Built by hand
    from any arrays :func:`prepare` takes (``MoEWeights(cfg, {"gate_up_blocks": ..., ...})``).

    Attributes:
        config: the layer's :class:`MoEConfig`.
        tensors: by weight name (``gate_up_blocks``, ``gate_up_scales``, ``down_blocks``,
            ``down_scales`` for MXFP4 or ``gate_up``, ``down`` for BF16; optional ``gate_up_bias``,
            ``down_bias``, ``router_weight``, ``router_bias``, ``correction_bias``).
    """

    config: MoEConfig
    tensors: dict[str, Any]

    @property
    def format(self) -> str:
        """``"mxfp4"`` or ``"bf16"``."""
        return "mxfp4" if _is_mxfp4(self.tensors) else "bf16"

    def prepare(self, device: Any = "cpu", **options: Any) -> "PreparedMoE":
        """:func:`prepare` of these weights for ``device``; ``options``: ``expert_map``,
        ``tp_rank``, ``tp_ranks`` (these weights then hold what :func:`prepare` says)."""
        return prepare(self.config, device=device, **options, **self.tensors)

    def _c(self) -> _lib.MoeWeightsC:
        return weights_c(self.tensors)

    @classmethod
    def _allocate(cls, config: MoEConfig, format: str, dtypes: dict[str, int]) -> "MoEWeights":
        """Empty host tensors for ``dtypes`` (weight name -> C ABI dtype code) in the checkpoint
        layout of ``config`` (torch CPU tensors)."""
        try:
            import torch
        except ImportError:
            raise ImportError("mxmoe: MoEWeights holds torch tensors: install torch (pip install mxmoe[torch])") from None
        shapes = checkpoint_shapes(config, format)
        return cls(config, {name: torch.empty(shapes[name], dtype=_tensor.torch_dtype(code))
                            for name, code in dtypes.items()})


def moe_forward(
    layer: PreparedMoE,
    x: Any,
    *,
    logits: Any = None,
    topk_ids: Any = None,
    topk_weights: Any = None,
    out: Any = None,
    workspace: Any = None,
    stream: int | None = None,
):
    """Run the MoE layer: ``out[T, H] = Σ_k w_k · expert_k(x)``.

    Args:
        layer: from :func:`prepare`; the tensors must be on its device.
        x: [T, H] contiguous; CPU: bf16 | f32, CUDA: bf16.
        logits: router logits f32 | bf16 [T, E]; or ``topk_ids`` i32 [T, k] with ``topk_weights``
            f32 [T, k] (precomputed routing); or neither (CPU: logits from the router weights
            given to :func:`prepare`).
        out: [T, H] to write into (CPU: f32 | bf16; CUDA: bf16); default: a new array of x's
            dtype.
        workspace: CUDA: device memory of at least ``layer.workspace_bytes(T)`` bytes; default:
            allocated from torch's caching allocator for torch tensors.
        stream: a ``cudaStream_t`` as an int; default: torch's current stream of x's device for
            torch tensors, else the legacy default stream.

    Returns ``out``. CUDA: no host synchronization; capturable in a CUDA graph; bitwise
    deterministic. The call runs in the extension (mxmoe._hotpath), which releases the GIL while
    the library runs.
    """
    return _lib.hotpath.moe_forward(layer, x, logits, topk_ids, topk_weights, out, workspace, stream)


def new_workspace(layer: PreparedMoE, stream: int, nbytes: int, capturing: bool) -> tuple[Any, int, int]:
    """A workspace of at least ``nbytes`` on the layer's device for a forward on ``stream``, as
    (owner, pointer, bytes); called by the extension (hotpath.c, workspace_of) when the layer
    keeps none for the stream, the forward needs more than it keeps, or the stream captures.

    Outside capture, up to CACHED_WORKSPACE_BYTES: the layer's own for the stream, made here once
    (CACHED_WORKSPACE_BYTES of library memory, kept in ``layer._workspaces``). Otherwise torch
    memory for this call, from its caching allocator for ``stream`` (torch.cuda.ExternalStream
    when it is not torch's current stream there): reused only in that stream's order after the
    call, and, while the stream captures, taken from the capture's own pool, which torch keeps
    for as long as the graph lives."""
    device = layer._device[1]
    if not capturing and nbytes <= CACHED_WORKSPACE_BYTES:
        memory = _DeviceMemory(device, CACHED_WORKSPACE_BYTES)
        entry = (memory, memory.ptr, CACHED_WORKSPACE_BYTES)
        layer._workspaces[stream] = entry
        return entry
    torch = sys.modules["torch"]
    if stream == _tensor.current_raw_stream(device):
        ws = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    else:
        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=f"cuda:{device}")):
            ws = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    return ws, ws.data_ptr(), nbytes


def live_layer(layer_id: int) -> PreparedMoE:
    """The prepared layer a torch op names by id; InvalidArgument when it was freed."""
    ref = _live_layers.get(layer_id)
    layer = ref() if ref is not None else None
    if layer is None or not layer._handle:
        raise invalid("layer", "a live PreparedMoE", f"id {layer_id}, which was closed or collected")
    return layer


_lib.hotpath.bind(live_layers=_live_layers, live_layer=live_layer, new_workspace=new_workspace)
