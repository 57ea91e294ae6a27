"""The ``gpuctl`` device type in the client's PyTorch: registration of PyTorch's PrivateUse1 backend
under the name "gpuctl", its factory kernels, and autocast for it.

* ``torch.device("gpuctl", 0)`` is the leased slice. PrivateUse1 is renamed "gpuctl" and set up
  as a Python backend (device guard, hooks, ``torch.gpuctl`` module: ``manual_seed_all`` sends
  the seed to the worker, ``synchronize`` waits for it), so autograd and ``torch.manual_seed``
  treat it as a device.
* Factory ops with ``device=gpuctl`` and no remote tensor argument (``torch.randn(..., device=d)``,
  ``x.to(d)`` of a CPU tensor) reach the PrivateUse1 kernels registered here for
  ``empty.memory_format`` and ``empty_strided``; every composite factory decomposes into those.
* Autocast: ``torch.autocast("gpuctl", dtype=...)`` applies CUDA's autocast policy (the op lists
  of ATen's autocast_mode.cpp for CUDA): matmul/convolution/linear/attention ops in the autocast
  dtype, the precision-sensitive ops (softmax, losses, norms, exp/log, ...) in float32, and the
  promote ops in the widest input type. Other ops fall through.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

NAME = "gpuctl"
_lock = threading.Lock()
_ready = False

#: CUDA's autocast lists (ATen autocast_mode.cpp), by ATen operator name.
LOWER_PRECISION_OPS = (
    "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution "
    "prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul "
    "linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention"
).split()
FP32_OPS = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus layer_norm "
    "native_layer_norm group_norm frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss "
    "cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss "
    "mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss "
    "binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp prod softmax log_softmax cumprod cumsum "
    "linalg_vector_norm sum"
).split()
PROMOTE_OPS = "addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put scatter_add tensordot cat stack".split()


class _BackendModule:
    """``torch.gpuctl``: what PyTorch asks of a device module (and a few user calls)."""

    seed_hook: Callable[[int], None] | None = None
    sync_hook: Callable[[], None] | None = None

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        """Called by ``torch.manual_seed(seed)``: the worker's generator is seeded too."""
        if cls.seed_hook is not None:
            cls.seed_hook(int(seed))

    manual_seed = manual_seed_all

    @classmethod
    def synchronize(cls, device: Any = None) -> None:
        """Wait until the worker has run every op sent so far (raises its first error)."""
        if cls.sync_hook is not None:
            cls.sync_hook()


def setup(empty_memory_format: Callable[..., Any], empty_strided: Callable[..., Any],
          factory_kernel: Callable[[Any], Callable[..., Any]] | None = None,
          factories: tuple[str, ...] = ()) -> None:
    """Register the gpuctl device (once per process). Raises RuntimeError when another library
    already took PyTorch's PrivateUse1 backend under another name, or this torch is too old."""
    global _ready
    with _lock:
        if _ready:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", NAME):
            raise RuntimeError(f"gpuctl.torch: PyTorch's PrivateUse1 backend is already taken by {current!r}")
        try:
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
        except ImportError:
            raise RuntimeError(f"gpuctl.torch needs a PyTorch with Python backends (2.9 or later); this is "
                               f"{torch.__version__}") from None
        if current == "privateuseone":
            _setup_privateuseone_for_python_backend(NAME, _BackendModule)
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("empty.memory_format", empty_memory_format, "PrivateUse1")
        lib.impl("empty_strided", empty_strided, "PrivateUse1")
        for name in factories:
            packet = getattr(torch.ops.aten, name)
            for overload in packet.overloads():
                if "out" in overload:
                    continue
                lib.impl(name if overload == "default" else f"{name}.{overload}",
                         factory_kernel(getattr(packet, overload)), "PrivateUse1")
        fallback = torch.library.Library("_", "IMPL")
        fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        autocast = torch.library.Library("aten", "IMPL")
        for names, policy in ((LOWER_PRECISION_OPS, _lower), (FP32_OPS, _fp32), (PROMOTE_OPS, _promote)):
            for name in names:
                packet = getattr(torch.ops.aten, name, None)
                if packet is None:
                    continue
                for overload in packet.overloads():
                    op = getattr(packet, overload)
                    autocast.impl(name if overload == "default" else f"{name}.{overload}", policy(op),
                                  "AutocastPrivateUse1")
        _LIBS.extend([lib, fallback, autocast])
        _ready = True


_LIBS: list[Any] = []
_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == NAME and t.is_floating_point() and t.dtype is not torch.float64


def _cast(v: Any, dtype: torch.dtype) -> Any:
    if _eligible(v):
        return v if v.dtype is dtype else v.to(dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(x, dtype) for x in v)
    return v


def _lower(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype(NAME)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def _fp32(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*_cast(args, torch.float32), **{k: _cast(v, torch.float32) for k, v in kwargs.items()})

    return kernel


def _promote(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        widest: torch.dtype | None = None
        for v in list(args) + list(kwargs.values()):
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if _eligible(t):
                    widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            if widest is None:
                return op(*args, **kwargs)
            return op(*_cast(args, widest), **{k: _cast(v, widest) for k, v in kwargs.items()})

    return kernel
