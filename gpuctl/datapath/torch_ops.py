"""The allow-list of PyTorch ATen operators a lease worker runs for ``gpuctl.torch``, and the wire
names of the torch-specific argument values.

Torch ops travel as ``"aten.<name>.<overload>"`` (``str(torch.ops.aten.add_.Tensor)``). Only the
operator names in :data:`ATEN_OPS` (any overload of them) are run; anything else is refused with
"aten.x.y is not in gpuctl.torch's allow-list". The list holds what neural-network training uses
(elementwise math, reductions, matmul, convolution, normalization, pooling, losses, dropout,
indexing, random fills, foreach/fused optimizer kernels, AMP helpers); none of these operators
touches files, processes or Python objects. :data:`VIEW_OPS` are the view operators the client
applies without a message: the worker replays them on the handle's tensor when a view is used.

This module imports nothing from torch, so the client can check names before sending them.
"""

from __future__ import annotations

#: ATen operator names (without overload) a worker runs. Sources: the ops of a ResNet-50 and a
#: torch.nn transformer training step (TorchDispatchMode traces, ../shared/facts), torch.optim
#: (SGD, Adam, AdamW: foreach, for-loop and fused), clip_grad_norm_, autocast, GradScaler.
ATEN_OPS = frozenset("""
abs abs_ neg neg_ exp exp_ exp2 expm1 log log_ log2 log10 log1p sqrt sqrt_ rsqrt rsqrt_ sin sin_ cos cos_
tan tanh tanh_ sigmoid sigmoid_ sign sgn floor ceil round trunc frac reciprocal reciprocal_ erf erfinv
square relu relu_ gelu gelu_ silu silu_ mish mish_ hardtanh hardtanh_ hardswish hardswish_ hardsigmoid
leaky_relu leaky_relu_ elu elu_ softplus logit nan_to_num nan_to_num_ clamp clamp_ clamp_min clamp_min_
clamp_max clamp_max_ pow pow_ atan2 lerp lerp_ where isnan isinf isfinite logical_not logical_and
logical_or bitwise_not bitwise_and bitwise_or bitwise_xor add add_ sub sub_ rsub mul mul_ div div_
remainder fmod maximum minimum fmax fmin eq ne lt le gt ge eq_ ne_ lt_ le_ gt_ ge_ addcmul addcmul_
addcdiv addcdiv_ sign_ floor_ ceil_ round_ trunc_ exp2_ erf_
threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward hardtanh_backward
leaky_relu_backward elu_backward softplus_backward mish_backward hardswish_backward hardsigmoid_backward
sum mean prod amax amin max min argmax argmin var var_mean std std_mean norm linalg_vector_norm
logsumexp cumsum cumprod all any count_nonzero topk sort argsort
mm bmm addmm addmm_ baddbmm addbmm dot vdot mv addmv _addmm_activation
_scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward
_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_backward
_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention_for_cpu_backward
_scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward
convolution convolution_backward _convolution cudnn_convolution
native_batch_norm native_batch_norm_backward cudnn_batch_norm cudnn_batch_norm_backward
_native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
_batch_norm_with_update _batch_norm_no_update batch_norm_backward
native_layer_norm native_layer_norm_backward native_group_norm native_group_norm_backward
_fused_rms_norm _fused_rms_norm_backward
max_pool2d_with_indices max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward
_adaptive_avg_pool2d _adaptive_avg_pool2d_backward adaptive_max_pool2d adaptive_max_pool2d_backward
_log_softmax _log_softmax_backward_data _softmax _softmax_backward_data _safe_softmax
nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward mse_loss mse_loss_backward
smooth_l1_loss smooth_l1_loss_backward huber_loss huber_loss_backward binary_cross_entropy
binary_cross_entropy_backward binary_cross_entropy_with_logits
native_dropout native_dropout_backward bernoulli bernoulli_ normal_ uniform_ random_ randperm
exponential_ multinomial
empty empty_strided empty_like new_empty new_empty_strided full full_like fill_ zero_ zeros zeros_like
ones ones_like new_zeros new_ones new_full arange scalar_tensor linspace eye tril triu tril_ triu_
clone _to_copy copy_ cat stack split split_with_sizes chunk unbind narrow index_select gather scatter
scatter_ scatter_add scatter_add_ index index_put index_put_ _index_put_impl_ index_add index_add_
index_copy index_copy_ masked_fill masked_fill_ masked_scatter masked_select nonzero take flip roll
repeat repeat_interleave constant_pad_nd reflection_pad2d replication_pad2d embedding
embedding_dense_backward unfold view t transpose permute expand as_strided select slice unsqueeze squeeze
diagonal diag_embed alias detach _unsafe_view select_backward slice_backward _unique2 bucketize
searchsorted lift_fresh expand_copy view_copy _reshape_alias
_foreach_add _foreach_add_ _foreach_sub _foreach_sub_ _foreach_mul _foreach_mul_ _foreach_div _foreach_div_
_foreach_addcmul _foreach_addcmul_ _foreach_addcdiv _foreach_addcdiv_ _foreach_sqrt _foreach_sqrt_
_foreach_lerp _foreach_lerp_ _foreach_neg _foreach_neg_ _foreach_norm _foreach_maximum _foreach_maximum_
_foreach_zero_ _foreach_copy_ _foreach_pow _foreach_pow_ _foreach_reciprocal _foreach_reciprocal_ _foreach_sign
_foreach_abs _foreach_clamp_min _foreach_clamp_min_ _foreach_clamp_max _foreach_clamp_max_ _foreach_exp
_foreach_exp_ _foreach_rsqrt _foreach_rsqrt_
_fused_adam_ _fused_adamw_ _fused_sgd_
_local_scalar_dense is_nonzero equal isclose allclose _amp_foreach_non_finite_check_and_unscale_ _amp_update_scale_
""".split())

#: View operators the client computes without a message (output metadata from meta tensors) and
#: the worker replays on the handle's tensor when the view is used as an argument.
VIEW_OPS = frozenset("""
view t transpose permute expand as_strided select slice unsqueeze squeeze alias _unsafe_view
_reshape_alias diagonal unfold
""".split())

#: In-place operators that change a tensor's shape or strides: the client's tensor metadata cannot
#: follow them, so they are refused at the call.
METADATA_INPLACE_OPS = frozenset("t_ transpose_ squeeze_ unsqueeze_ resize_ resize_as_ set_ as_strided_ swapdims_ "
                                 "swapaxes_ unsqueeze_copy".split())

#: dtypes that may be named on the wire (torch attribute names).
TORCH_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                "float64", "complex64", "complex128")

#: memory formats that may be named on the wire.
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")

#: Longest view chain a tensor argument may carry (the client materializes longer ones).
MAX_VIEW_CHAIN = 16

#: Longest string argument (reduction names, einsum equations, gelu approximation).
MAX_STRING_CHARS = 256


def split_name(name: str) -> tuple[str, str] | None:
    """("add_", "Tensor") for "aten.add_.Tensor", ("relu", "default") for "aten.relu.default";
    None when `name` is not of that form."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten" or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def allowed(name: str) -> bool:
    """True when the ATen overload `name` ("aten.op.overload") is on the allow-list."""
    parts = split_name(name)
    return parts is not None and parts[0] in ATEN_OPS
