// Every te_lite op schema, declared once (TORCH_LIBRARY). Device implementations are registered by
// the family files (cast.cpp, block_scaling.cpp, ordered_gemm.cpp, norm.cpp, activation.cpp,
// gemm.cpp, softmax.cpp, rope.cpp, attention.cpp, router.cpp, permutation.cpp,
// permutation_index.cpp, cross_entropy.cpp); fake
// kernels and autograd by transformer_engine_lite/pytorch/te_lite_ops.py, whose docstring
// documents each op (the router's autograd: pytorch/router.py, as TE's).
#include <torch/library.h>

TORCH_LIBRARY(te_lite, m) {
  // Fake kernels live in Python: the dispatcher imports this module when it needs them.
  m.set_python_module("transformer_engine_lite.pytorch.te_lite_ops");

  // ---- cast (per-tensor and MXFP8), amax and scales
  m.def("quantize(Tensor x, Tensor scale, ScalarType fp8_dtype) -> (Tensor, Tensor, Tensor)");
  m.def(
      "quantize_mxfp8(Tensor x, ScalarType fp8_dtype, bool rowwise, bool columnwise) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  m.def("dequantize(Tensor data, Tensor scale_inv, ScalarType out_dtype) -> Tensor");
  m.def(
      "dequantize_mxfp8(Tensor data, Tensor scale_inv, bool columnwise, ScalarType out_dtype) -> "
      "Tensor");
  m.def(
      "quantize_fp8_block(Tensor x, ScalarType fp8_dtype, int block_scaling_dim, bool rowwise, "
      "bool columnwise, bool force_pow_2_scales, float amax_epsilon) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "dequantize_fp8_block(Tensor data, Tensor scale_inv, int block_scaling_dim, bool columnwise, "
      "ScalarType out_dtype) -> Tensor");
  m.def("block_gemm_accumulate_(Tensor(a!) y, Tensor p, Tensor first, Tensor second) -> ()");
  m.def("nvfp4_block_gemm(Tensor b_data, Tensor b_scale, Tensor a_data, Tensor a_scale) -> Tensor");
  m.def("ordered_bmm(Tensor a, Tensor b, bool transa, bool transb) -> Tensor");
  m.def(
      "quantize_nvfp4(Tensor x, bool rowwise, bool columnwise, bool two_d, bool rht, "
      "int rht_sign_mask, bool stochastic_rounding, int seed, int offset, bool row_scaled=False, "
      "int four_over_six=0, int e4m3_max=448, bool err_fast_math=False, "
      "Tensor? row_amax_in=None, Tensor? col_amax_in=None) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "dequantize_nvfp4(Tensor data, Tensor scale_inv, Tensor amax, ScalarType out_dtype, "
      "bool row_scaled=False, int e4m3_max=448) -> Tensor");
  m.def("compute_amax(Tensor x) -> Tensor");
  m.def(
      "compute_scale_from_amax(Tensor amax, ScalarType fp8_dtype, float epsilon, "
      "bool force_pow_2_scales) -> (Tensor, Tensor)");

  // ---- delayed-scaling recipe
  m.def(
      "delayed_scaling_update(Tensor amax_history, Tensor scale, str amax_compute_algo, "
      "ScalarType fp8_dtype, float margin) -> (Tensor, Tensor)");
  m.def(
      "delayed_scaling_update_(Tensor(a!) amax_history, Tensor(b!) scale, str amax_compute_algo, "
      "ScalarType fp8_dtype, float margin) -> ()");

  // ---- transpose
  m.def("transpose(Tensor x) -> Tensor");
  m.def(
      "cast_transpose(Tensor x, Tensor scale, ScalarType fp8_dtype) -> "
      "(Tensor, Tensor, Tensor, Tensor)");

  // ---- normalization
  m.def(
      "layernorm_fwd(Tensor x, Tensor gamma, Tensor beta, float eps, bool zero_centered_gamma, "
      "ScalarType? out_dtype=None, Tensor? scale=None) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "layernorm_bwd(Tensor dz, Tensor x, Tensor mu, Tensor rsigma, Tensor gamma, "
      "bool zero_centered_gamma) -> (Tensor, Tensor, Tensor)");
  m.def(
      "rmsnorm_fwd(Tensor x, Tensor gamma, float eps, bool zero_centered_gamma, "
      "ScalarType? out_dtype=None, Tensor? scale=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "rmsnorm_bwd(Tensor dz, Tensor x, Tensor rsigma, Tensor gamma, bool zero_centered_gamma) -> "
      "(Tensor, Tensor)");
  m.def(
      "rmsnorm_bwd_add(Tensor dz, Tensor x, Tensor add, Tensor rsigma, Tensor gamma, "
      "bool zero_centered_gamma) -> (Tensor, Tensor)");

  // ---- activations
  m.def(
      "activation_fwd(Tensor x, str activation, ScalarType? out_dtype=None, Tensor? scale=None) -> "
      "(Tensor, Tensor, Tensor)");
  m.def("activation_bwd(Tensor grad, Tensor x, str activation) -> Tensor");
  m.def(
      "clamped_swiglu_fwd(Tensor x, float limit, float alpha, ScalarType? out_dtype=None, "
      "Tensor? scale=None, float glu_linear_offset=1.0) -> (Tensor, Tensor, Tensor)");
  m.def(
      "clamped_swiglu_bwd(Tensor grad, Tensor x, float limit, float alpha, "
      "float glu_linear_offset=1.0) -> Tensor");

  // ---- GEMM (TE's nvte_cublas_gemm_scaled semantics)
  m.def(
      "gemm(Tensor A, Tensor? A_scale_inv, bool transa, Tensor B, Tensor? B_scale_inv, "
      "bool transb, ScalarType out_dtype, Tensor? bias=None, bool gelu=False, bool grad=False, "
      "Tensor? gelu_input=None, Tensor? out_scale=None, float alpha=1.0) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "gemm_accumulate_(Tensor(a!) D, Tensor A, Tensor? A_scale_inv, bool transa, Tensor B, "
      "Tensor? B_scale_inv, bool transb, Tensor? bias=None, float alpha=1.0, "
      "float beta=1.0) -> ()");

  // ---- fused softmax
  m.def("scaled_softmax_fwd(Tensor x, float scale) -> Tensor");
  m.def("scaled_softmax_bwd(Tensor dy, Tensor y, float scale) -> Tensor");
  m.def("scaled_masked_softmax_fwd(Tensor x, Tensor mask, float scale) -> Tensor");
  m.def("scaled_masked_softmax_bwd(Tensor dy, Tensor y, float scale) -> Tensor");
  m.def("scaled_upper_triang_masked_softmax_fwd(Tensor x, float scale) -> Tensor");
  m.def("scaled_upper_triang_masked_softmax_bwd(Tensor dy, Tensor y, float scale) -> Tensor");
  m.def("scaled_aligned_causal_masked_softmax_fwd(Tensor x, float scale) -> Tensor");
  m.def("scaled_aligned_causal_masked_softmax_bwd(Tensor dy, Tensor y, float scale) -> Tensor");

  // ---- fused rotary position embedding (rope.cpp)
  m.def(
      "fused_rope_fwd(Tensor t, Tensor freqs, str tensor_format, bool interleaved, "
      "Tensor? cu_seqlens=None, Tensor? start_positions=None, int cp_size=1, int cp_rank=0) "
      "-> Tensor");
  m.def(
      "fused_rope_bwd(Tensor grad, Tensor freqs, str tensor_format, bool interleaved, "
      "Tensor? cu_seqlens=None, Tensor? start_positions=None, int cp_size=1, int cp_rank=0) "
      "-> Tensor");

  // ---- fused attention (flash backend; attention.cpp)
  m.def(
      "fused_attn_fwd(Tensor q, Tensor k, Tensor v, str qkv_layout, Tensor? bias, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv, "
      "float attn_scale, float dropout, Tensor? rng_state, str bias_type, str mask_type, "
      "int window_left, int window_right, bool is_training, str softmax_type=\"vanilla\", "
      "Tensor? softmax_offset=None) -> (Tensor out, Tensor softmax_lse)");
  m.def(
      "fused_attn_bwd(Tensor q, Tensor k, Tensor v, Tensor out, Tensor d_out, Tensor softmax_lse, "
      "str qkv_layout, Tensor? bias, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
      "int max_seqlen_q, int max_seqlen_kv, float attn_scale, float dropout, Tensor? rng_state, "
      "str bias_type, str mask_type, int window_left, int window_right, bool deterministic, "
      "str softmax_type=\"vanilla\", Tensor? softmax_offset=None) -> "
      "(Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor d_softmax_offset)");
  m.def(
      "fused_attn_dropout_mask(Tensor rng_state, int b, int h, int s_q, int s_kv, float dropout) "
      "-> Tensor");

  // ---- fused MoE router (router.cpp; TE's tex names)
  m.def(
      "fused_topk_with_score_function_fwd(Tensor logits, int topk, bool use_pre_softmax, "
      "int num_groups, int group_topk, float scaling_factor, int score_function, "
      "Tensor? expert_bias) -> (Tensor probs, Tensor routing_map, Tensor intermediate_output)");
  m.def(
      "fused_topk_with_score_function_bwd(Tensor routing_map, Tensor intermediate_output, "
      "Tensor grad_probs, int topk, bool use_pre_softmax, float scaling_factor, "
      "int score_function) -> Tensor");
  m.def(
      "fused_score_for_moe_aux_loss_fwd(Tensor logits, int topk, int score_function) -> "
      "(Tensor scores, Tensor routing_map, Tensor intermediate_output)");
  m.def(
      "fused_score_for_moe_aux_loss_bwd(Tensor intermediate_output, Tensor grad_scores, int topk, "
      "int score_function, ScalarType logits_dtype) -> Tensor");
  m.def(
      "fused_moe_aux_loss_fwd(Tensor probs, Tensor tokens_per_expert, int total_num_tokens, "
      "int num_experts, int topk, float coeff) -> (Tensor aux_loss, Tensor Const_buf)");
  m.def(
      "fused_moe_aux_loss_bwd(Tensor Const_buf, Tensor tokens_per_expert, Tensor grad_aux_loss, "
      "int num_rows, int num_cols) -> Tensor");
}

// ---- MoE token permutation (permutation.cpp): a fragment of its own, because its fake kernels
// live beside its autograd in pytorch/permutation.py (torch wants them in the schema's module).
TORCH_LIBRARY_FRAGMENT(te_lite, m) {
  m.set_python_module("transformer_engine_lite.pytorch.permutation");
  m.def("moe_make_row_id_map(Tensor routing_map, int num_out_tokens) -> Tensor");
  m.def(
      "moe_permute_with_mask_map(Tensor inp, Tensor row_id_map, Tensor? probs, "
      "int num_out_tokens) -> (Tensor output, Tensor permuted_probs)");
  m.def(
      "moe_unpermute_with_mask_map(Tensor inp, Tensor row_id_map, Tensor? merging_probs, "
      "Tensor? permuted_probs, int num_tokens) -> (Tensor output, Tensor unpermuted_probs)");
  m.def(
      "moe_unpermute_with_mask_map_bwd_with_merging_probs(Tensor fwd_output_grad, "
      "Tensor row_id_map, Tensor fwd_input, Tensor merging_probs) -> "
      "(Tensor fwd_input_grad, Tensor merging_probs_grad)");
  m.def(
      "moe_make_chunk_sort_map(Tensor split_sizes, Tensor sorted_index, int num_tokens) -> "
      "Tensor");
  m.def(
      "moe_sort_chunks_by_map(Tensor inp, Tensor row_id_map, Tensor? probs, bool is_forward) -> "
      "(Tensor output, Tensor permuted_probs)");
  // Index map (permutation_index.cpp): row_id_map int32 [topK * num_tokens].
  m.def("moe_index_make_row_id_map(Tensor indices, int num_out_tokens) -> Tensor");
  m.def("moe_permute_with_index_map(Tensor inp, Tensor row_id_map, int num_out_tokens) -> Tensor");
  m.def(
      "moe_unpermute_with_index_map(Tensor inp, Tensor row_id_map, Tensor? probs, "
      "int num_tokens) -> Tensor");
  m.def(
      "moe_unpermute_with_index_map_bwd(Tensor grad, Tensor row_id_map, Tensor fwd_input, "
      "Tensor probs) -> (Tensor fwd_input_grad, Tensor probs_grad)");
}

// ---- Multi-tensor ops for fused optimizers (multi_tensor.cpp): a fragment of its own, because its
// fake kernels live in pytorch/optimizers/_ops.py. TE's tensor_lists are one Tensor[] per list (an
// empty list = absent); they mutate their lists in place.
TORCH_LIBRARY_FRAGMENT(te_lite, m) {
  m.set_python_module("transformer_engine_lite.pytorch.optimizers._ops");
  m.def(
      "multi_tensor_scale(int chunk_size, Tensor(a!) noop_flag, Tensor[] inputs, "
      "Tensor(b!)[] outputs, float scale) -> ()");
  m.def(
      "multi_tensor_l2norm(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, "
      "bool per_tensor) -> (Tensor, Tensor)");
  m.def(
      "multi_tensor_unscale_l2norm(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, "
      "Tensor inv_scale, bool per_tensor) -> (Tensor, Tensor)");
  m.def(
      "multi_tensor_adam(int chunk_size, Tensor noop_flag, Tensor[] grads, Tensor(a!)[] params, "
      "Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] master_params, float lr, "
      "float beta1, float beta2, float eps, int step, int adam_w_mode, int bias_correction, "
      "float weight_decay) -> ()");
  m.def(
      "multi_tensor_adam_param_remainder(int chunk_size, Tensor noop_flag, Tensor[] grads, "
      "Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] param_remainders, float lr, float beta1, float beta2, float eps, int step, "
      "int adam_w_mode, int bias_correction, float weight_decay) -> ()");
  m.def(
      "multi_tensor_adam_fp8(int chunk_size, Tensor noop_flag, Tensor[] grads, "
      "Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] master_params, Tensor[] scales, Tensor(e!)[] amaxes, "
      "Tensor(f!)[] scale_invs, float lr, float beta1, float beta2, float eps, int step, "
      "int adam_w_mode, int bias_correction, float weight_decay, ScalarType fp8_dtype) -> ()");
  m.def(
      "multi_tensor_adam_capturable(int chunk_size, Tensor noop_flag, Tensor[] grads, "
      "Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] master_params, Tensor lr, float beta1, float beta2, float eps, Tensor step, "
      "int adam_w_mode, int bias_correction, float weight_decay, Tensor inv_scale) -> ()");
  m.def(
      "multi_tensor_sgd(int chunk_size, Tensor noop_flag, Tensor[] grads, Tensor(a!)[] weights, "
      "Tensor(b!)[] momentum_buffers, Tensor(c!)[] model_weights, float wd, float momentum, "
      "float dampening, float lr, bool nesterov, bool first_run, bool wd_after_momentum, "
      "float scale) -> ()");
  m.def(
      "multi_tensor_compute_scale_and_scale_inv(int chunk_size, Tensor noop_flag, "
      "Tensor[] amaxes, Tensor(a!)[] scales, Tensor(b!)[] scale_invs, float max_fp8, "
      "bool force_pow_2_scales, float epsilon) -> ()");
}

// ---- Vocab-parallel cross entropy (cross_entropy.cpp): a fragment of its own, because its fake
// kernels live beside its autograd in pytorch/cross_entropy.py.
TORCH_LIBRARY_FRAGMENT(te_lite, m) {
  m.set_python_module("transformer_engine_lite.pytorch.cross_entropy");
  m.def(
      "cross_entropy_row_stats(Tensor logits, Tensor target, int rank, int world_size, "
      "int ignore_idx) -> Tensor");
  m.def(
      "cross_entropy_fwd(Tensor logits, Tensor target, Tensor stats, int rank, int ignore_idx, "
      "float label_smoothing, bool reduce_loss) -> (Tensor loss, Tensor grad)");
  m.def("cross_entropy_bwd(Tensor grad, Tensor grad_output) -> Tensor");
}
