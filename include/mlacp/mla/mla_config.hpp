// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The dimensions of an MLA block and which of its inputs need gradients.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mlacp {

/// How keys and values reach the head-sharded attention (docs/spec.md "Two schedules").
enum class MlaStrategy {
  latent,    ///< all-gather the latent payload [c, k_pe]; each rank expands only its heads over all S tokens
  expanded,  ///< each rank expands all heads on its tokens; Q, K and V each go through the all-to-all
};

const char* to_string(MlaStrategy strategy) noexcept;
/// "latent" or "expanded"; throws InvalidArgument naming the value otherwise.
MlaStrategy parse_strategy(const std::string& name);

/// What a float layer's collectives move (MlaConfig::wire_dtype): each setting names a wire codec per kind of exchange
/// (mla/wire_policy.hpp's table). The sender encodes its float payload (bf16: rounded to nearest even) before the
/// launch, the collective moves the encoded values, and the receiver decodes them into its float destination after
/// the wait; everything else (GEMMs, the attention core, the gradients) stays float. The overlap schedule is
/// unchanged: same launches, same waits, same order.
enum class WireDtype {
  same,          ///< "same": the layer's value type on the wire (today's path, bit for bit)
  bfloat16,      ///< "bf16": the all-to-alls (Q, K, V, O; dO, dQ, dK, dV) and the latent all-gather in bf16; the
                 ///< latent reduce-scatter's partial sums stay float
  bfloat16_all,  ///< "bf16_all": bf16 as above, and the latent reduce-scatter's partial sums in bf16 too (still summed
                 ///< in float inside the library; refused with MLACP_REDUCE_SCATTER=mpi, which cannot sum bf16)
  float8_e4m3,   ///< "fp8": the forward's all-to-alls and all-gather as fp8 E4M3 with a float scale per row
                 ///< (wire/fp8_e4m3_codec.hpp), the backward's all-to-alls in bf16, the reduce-scatter in float
};

const char* to_string(WireDtype wire) noexcept;
/// A name of mla/wire_policy.hpp's table ("same", "bf16", "bf16_all", "fp8"); throws InvalidArgument naming the value
/// and the names otherwise.
WireDtype parse_wire_dtype(const std::string& name);

/// Which global tokens each ring chunk holds on a two-level mesh (Mesh(comm, ring) with C > 1; token_map.hpp has the
/// formulas). Ring chunk g is what Ulysses group g holds together; each of its U ranks holds a contiguous part of it.
enum class RingLayout {
  contiguous,  ///< "contiguous": chunk g is part g of the S tokens split into C parts (causal work grows with g)
  zigzag,      ///< "zigzag": the S tokens split into 2C parts; chunk g is parts g and 2C-1-g (balanced causal work)
};

const char* to_string(RingLayout layout) noexcept;
/// "contiguous" or "zigzag"; throws InvalidArgument naming the value otherwise.
RingLayout parse_ring_layout(const std::string& name);

/// How a bf16 layer computes (MlaConfig::bf16_compute; float and double layers ignore it). Both store bf16 at the
/// layer's edges (x, y, dx) and on the wire, and accumulate in float; they differ in where the GEMMs and the core run:
enum class Bf16Compute {
  automatic,  ///< "auto": MLACP_BF16_COMPUTE where set; otherwise the first forward takes bf16 untimed where the bf16
              ///< GEMMs run on bf16 matrix hardware on every rank (Bf16GemmPlan::on_bf16_hardware: cuBLAS, AMX),
              ///< else times one pass of each (forward, and backward where the call needs gradients), takes the
              ///< slower rank's times (one MPI allreduce of the maximum) and keeps the faster on every rank
              ///< (MlaAttention::bf16_compute_choice)
  bfloat16,   ///< "bf16": the GEMMs on bf16 operands (Bf16GemmPlan: oneDNN, cuBLAS, or float BLAS on widened copies
              ///< per call) and the core on bf16 where it can; activations saved in bf16
  float32,    ///< "float": a float layer inside: the weights widened to float at each forward (4 bytes a parameter
              ///< held), x widened, float GEMMs and core, bf16 on the wire; y and dx rounded to bf16 once
};

const char* to_string(Bf16Compute compute) noexcept;
/// "auto", "bf16" or "float"; throws InvalidArgument naming the value otherwise.
Bf16Compute parse_bf16_compute(const std::string& name);
/// What a bf16 layer configured with `configured` is asked to compute with: `configured`, or MLACP_BF16_COMPUTE where
/// `configured` is auto and the variable is set (automatic: neither fixes it, the first forward chooses). The one
/// rule the layer (MlaAttention's constructor) and the memory model (model::predict_memory) both follow.
Bf16Compute requested_bf16_compute(Bf16Compute configured);
/// The path a layer asked `requested` takes before any timing: bf16 where it is asked auto and its bf16 GEMMs run on
/// bf16 matrix hardware on every rank (`bf16_hardware`: Bf16GemmPlan::on_bf16_hardware, agreed across ranks by the
/// layer), else `requested` (automatic: the first forward times both paths). The one rule the layer
/// (MlaAttention::bf16_compute_choice) and the memory model both follow.
Bf16Compute untimed_bf16_compute(Bf16Compute requested, bool bf16_hardware);

/// The dimensions of one MLA attention block (docs/spec.md "Names"). `seq` is the global sequence length S.
///
/// `batch` and `seq` are optional maxima for the layer: 0 (unset) lets every call bring any B and S (the layer derives
/// S from the ranks' shards per call); set, they bound every call's B and S (checked) and are the shape the planner
/// and the performance model price. Packed documents in the configuration (cu_seqlens) need `seq`: they end there.
struct MlaConfig {
  int batch = 0;      ///< B, the largest batch a call brings (0: unset, any)
  int seq = 0;        ///< S, global: the longest sequence a call brings (0: unset, any)
  int hidden = 0;     ///< D
  int heads = 0;      ///< H, global
  int nope = 0;       ///< dn, qk_nope_head_dim
  int rope = 0;       ///< dr, qk_rope_head_dim (even)
  int vdim = 0;       ///< dv, v_head_dim
  int latent = 0;     ///< R, kv_lora_rank
  bool bias = false;  ///< b_q, b_kvb and b_o present
  /// Rq, q_lora_rank: 0 (the default) projects the query with one dense w_q [H*dqk, D]; Rq > 0 factors it as
  /// DeepSeek-V2 and V3 do (docs/spec.md step 1): cq = RMSNorm(x w_qa^T) * g_q with w_qa [Rq, D], g_q [Rq] and
  /// rms_eps (the latent norm's epsilon), then q = cq w_qb^T + b_q with w_qb [H*dqk, Rq]. The parameter table
  /// (parameter_table.hpp) holds w_q or w_qa, g_q, w_qb accordingly.
  int q_lora_rank = 0;
  /// The attention's softmax scale (docs/spec.md step 6): 0 (the default) means 1/sqrt(dqk); a positive value replaces
  /// it (DeepSeek-V3's YaRN-adjusted scale, mscale^2 / sqrt(dqk)). Part of the configuration the ranks agree on.
  double softmax_scale = 0.0;
  MlaStrategy strategy = MlaStrategy::latent;
  double rope_base = 10000.0;
  double rms_eps = 1e-6;
  /// true: the backward overlaps each collective with its independent compute. false: every collective is waited
  /// right after its launch (the blocking baseline of the perf tests; same numbers, same order of compute).
  bool overlap = true;
  /// Packed variable-length sequences (document_layout.hpp): cumulative document offsets c[0] = 0 < c[1] < ... <
  /// c[n] = seq over the global sequence, the same on every rank and for every batch row. Attention never crosses a
  /// document and RoPE positions restart at 0 at each document's start. Empty: one document (plain causal attention).
  /// (Default-initialised so that aggregate initialisations that stop before it stay free of -Wextra warnings.)
  std::vector<std::int64_t> cu_seqlens{};
  /// Packed documents per forward call that need no allocation (the per-call document offsets, MlaAttention::forward
  /// with cu_seqlens): a loop whose packings have at most this many documents allocates no View for them after its
  /// first iteration; more still work but allocate.
  int max_documents = 64;
  /// bf16 on the wire for a float layer (WireDtype). A double layer refuses anything but `same` (it is the accuracy
  /// reference); a bf16 layer's wire is bf16 already, so the setting changes nothing there. At P == 1 nothing is sent
  /// and nothing is rounded. Part of the configuration the ranks agree on.
  WireDtype wire_dtype = WireDtype::same;
  /// The ring's token layout on a two-level mesh (RingLayout; ignored when the mesh's ring size is 1, where rank r
  /// holds the contiguous part r of the S tokens). Part of the configuration the ranks agree on.
  RingLayout ring_layout = RingLayout::zigzag;
  /// How a bf16 layer computes (Bf16Compute; ignored by float and double layers): "auto" (the default) takes bf16 on
  /// bf16 matrix hardware, else times both at the first forward and keeps the faster. Part of the configuration the
  /// ranks agree on.
  Bf16Compute bf16_compute = Bf16Compute::automatic;
  /// YaRN RoPE scaling (docs/spec.md step 4; Hugging Face's rope_scaling of type yarn, kernels/rope_frequencies.hpp):
  /// the factor f (1, the default: plain RoPE, and the other rope_* rows are not read; f < 1 is refused), the original
  /// context length L0 (original_max_position_embeddings, required when f > 1), beta_fast and beta_slow (the ramp's
  /// ends in rotations), mscale and mscale_all_dim (0: absent) and the optional attention factor on cos and sin (0:
  /// derived from the mscales). The softmax scale is softmax_scale's: the layer applies no mscale to it itself
  /// (mla_config_from_hf computes it). Part of the configuration the ranks agree on.
  double rope_factor = 1.0;
  int rope_original_max_position = 0;
  double rope_beta_fast = 32.0;
  double rope_beta_slow = 1.0;
  double rope_mscale = 0.0;
  double rope_mscale_all_dim = 0.0;
  double rope_attention_factor = 0.0;
  /// The checkpoints' RoPE convention: true when their rope rows rotate interleaved pairs (x0, x1), (x2, x3), .. as
  /// every released DeepSeek-V2/V3 checkpoint does (and Hugging Face's rope_interleave). The layer computes in the
  /// rotate-half form either way; the DeepSeek loaders and savers permute the rows by it. A Hugging Face config
  /// without rope_interleave means true.
  bool rope_interleave = false;

  int qk_dim() const { return nope + rope; }
  /// Whether the query is factored (q-LoRA, q_lora_rank > 0).
  bool q_lora() const { return q_lora_rank > 0; }
  /// The softmax scale the attention uses: softmax_scale when set (> 0), else 1/sqrt(dqk).
  double attention_scale() const;
  /// Why this configuration cannot run on a group of `group_size` ranks ("" when it can): every dimension positive
  /// (batch and seq: 0, unset, or positive), dr even, cu_seqlens empty or strictly increasing from 0 to seq
  /// (cu_seqlens_error), max_documents positive. S and H need neither be divisible by P nor reach it: with S < P or H <
  /// P the ranks past them hold no token or no head (and still join every collective).
  std::string error(int group_size) const;
  /// Why the YaRN rows (rope_factor, ...) are not a scaling mlacp can apply ("" when they are); part of error().
  std::string yarn_error() const;
  /// Why a pass of `batch` x `seq` tokens would overflow a product the layer computes in int ("" when none): the part
  /// of error() that a call's shape can change, so the per-call check (detail::call_shape) runs it alone with the
  /// call's B and S. error() runs it with the configuration's own batch and seq.
  std::string int_products_error(std::int64_t batch, std::int64_t seq) const;
  /// Why this configuration names no shape to price ("" when batch and seq are both set): the planner and the
  /// performance model price one shape, which the layer only takes as optional maxima.
  std::string shape_error() const;
  /// A one-line description, for messages and reports.
  std::string describe() const;
};

/// Why `cu_seqlens` is not a packing of a sequence of `seq` tokens ("" when it is, or when it is empty: one document):
/// the message of DocumentLayout::validate, prefixed "mlacp::<who>: cu_seqlens". MlaConfig::error and the per-call
/// packing of MlaAttention::forward both check with it.
std::string cu_seqlens_error(const std::vector<std::int64_t>& cu_seqlens, int seq, const char* who);

/// Which inputs, weights and biases need a gradient: x's flag, then one per entry of the parameter table
/// (parameter_table.hpp: its `flag` member pointer, named as the parameter). A false flag skips that GEMM, and when
/// nothing upstream of a collective needs a gradient, its inverse collective is not launched at all (nothing waits for
/// it either).
struct MlaRequiresGrad {
  bool x = true;
  bool w_q = true;
  bool b_q = true;
  bool w_kva = true;
  bool g_kv = true;
  bool w_kvb = true;
  bool b_kvb = true;
  bool w_o = true;
  bool b_o = true;
  // q-LoRA's parameters (MlaConfig::q_lora_rank > 0; a flag of a parameter the configuration lacks is ignored).
  bool w_qa = true;
  bool g_q = true;
  bool w_qb = true;

  /// Every flag false. (One initialiser per flag: a flag added without one fails -Wmissing-field-initializers, and
  /// a static_assert in weights.hpp ties the flags to the parameter table.)
  static MlaRequiresGrad none() {
    return {false, false, false, false, false, false, false, false, false, false, false, false};
  }
};

}  // namespace mlacp
