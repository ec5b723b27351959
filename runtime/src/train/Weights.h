// Weights named as Hugging Face's GPT-2 and Llama, loaded into and saved from
// a ParameterStore through safetensors files.
#ifndef MTRT_SRC_TRAIN_WEIGHTS_H
#define MTRT_SRC_TRAIN_WEIGHTS_H

#include "core/Bundle.h"
#include "core/Safetensors.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::host {
class ParameterStore;
} // namespace mtrt::host

namespace mtrt::train {

/// What loadWeights did.
struct WeightsLoadReport {
  /// Parameters overwritten from the file: all of the bundle's but the
  /// expert biases it does not hold.
  size_t parameters = 0;
  /// Of those, the vocabulary tables (embedding, untied lm_head) whose file
  /// tensor had fewer rows than the bundle's padded vocabulary; their
  /// padding rows kept their values.
  size_t padded = 0;
  /// Tensors of the file that are not parameters and were accepted:
  /// Hugging Face's non-parameter buffers and a tied lm_head.weight.
  size_t ignored = 0;
  /// Expert biases (Parameter::isExpertBias) the file does not hold, as a
  /// model trained without aux-loss-free balancing has none: they keep
  /// their values (zeros at the start, Megatron-LM's).
  size_t expertBiasesKept = 0;
};

/// Whether parameter `name` is a table with one row per vocabulary entry,
/// padded by the compiler to padded_vocab_size as Megatron-LM does:
/// transformer.wte.weight, model.embed_tokens.weight and lm_head.weight.
bool isVocabularyTable(std::string_view name);

/// Whether `name` is GPT-2's fused transformer.h.N.attn.c_attn (weight or
/// bias): Hugging Face stores its columns as [q | k | v]; bundles and
/// checkpoints store them per query group (the group's query heads, its
/// key, its value), Megatron-LM's layout, so that a tensor-parallel column
/// split gives each rank whole groups.
bool isFusedQkv(std::string_view name);

/// For each of `columns` columns of the per-group layout of `heads` query
/// heads in `groups` key/value groups (0: one per head), the column of
/// Hugging Face's [q | k | v] it holds; nullopt when they do not divide
/// `columns` as (heads + 2 * groups) * head_dim.
std::optional<std::vector<int64_t>>
fusedQkvColumnsFromHuggingFace(int64_t heads, int64_t groups, int64_t columns);

/// Reorders the columns (last dimension) of the `count` row-major `values`:
/// column c of the result is column from[c] of the input when `gather`
/// (Hugging Face's to the per-group layout), and the other way round
/// otherwise.
template <typename T>
void permuteColumns(T *values, int64_t count, const std::vector<int64_t> &from,
                    bool gather);

/// Whether `name` is one of the buffers Hugging Face saves with a model
/// that are not parameters: GPT-2's transformer.h.N.attn.bias and
/// transformer.h.N.attn.masked_bias (the causal mask), Llama's
/// model.layers.N.self_attn.rotary_emb.inv_freq.
bool isKnownBuffer(std::string_view name);

/// Overwrites every parameter of `store` (made for `bundle`) with the tensor
/// of the same name in `file`, converted from F32, F64, BF16 or F16 to the
/// store's float type. Names may also be in the prefix-less form that
/// GPT2Model (`wte.weight`, `h.0...`) or LlamaModel (`embed_tokens.weight`,
/// `layers.0...`) saves; they are read as `transformer.` or `model.` names.
///
/// Every parameter must be present with the bundle's shape, except that the
/// vocabulary tables may have fewer rows than the bundle's padded
/// vocabulary (but not fewer than the model's vocab_size): those rows are
/// copied and the padding rows keep their values. Tensors that are not
/// parameters are refused, except known buffers (isKnownBuffer), which are
/// skipped, and lm_head.weight when the bundle ties the output layer to the
/// embedding, which must then equal the file's embedding table.
///
/// GPT-2's fused transformer.h.N.attn.c_attn (weight and bias) is Hugging
/// Face's [q | k | v] in files and Megatron-LM's per-group layout in the
/// bundle (each query group's heads, then its key, then its value); columns
/// are reordered on load and back on save.
///
/// Everything is checked before anything is written: on error the store is
/// unchanged. Throws Error (INVALID_ARGUMENT) naming the file, the tensor,
/// the shapes or types found and expected, and the fix.
WeightsLoadReport loadWeights(const SafetensorsFile &file, const Bundle &bundle,
                              host::ParameterStore &store);

/// The same for a bundle of several ranks: `ranks` holds the stores (made
/// for `bundle`) of some or all of its ranks, and each gets its shard of
/// every parameter it holds, cut from the file's whole tensor. The same
/// checks, all made before anything is written.
WeightsLoadReport loadWeights(const SafetensorsFile &file, const Bundle &bundle,
                              const std::vector<host::ParameterStore *> &ranks);

/// How --save-weights names a mixture-of-experts model's routed experts
/// (Llama names only): the bundle's per-layer tensors
/// (`model.layers.L.mlp.experts.gate_proj.weight`, `[E, out, in]`), or one
/// tensor per expert as the hub stores Mixtral
/// (`model.layers.L.block_sparse_moe.experts.N.w1/w3/w2.weight`, the router
/// `block_sparse_moe.gate.weight`) or Qwen3-MoE
/// (`model.layers.L.mlp.experts.N.gate_proj/up_proj/down_proj.weight`).
enum class ExpertNames { Bundle, Mixtral, Qwen3Moe };

/// `--save-weights-experts`'s value, or nullopt.
std::optional<ExpertNames> parseExpertNames(std::string_view text);

/// Throws Error (INVALID_ARGUMENT) when `bundle`'s parameters cannot be
/// written under `experts` (see saveWeights), naming the tensor and the fix;
/// megatron-train checks it before training, saveWeights again.
void checkExpertNames(const Bundle &bundle, ExpertNames experts);

/// Writes every parameter of `store` (made for `bundle`) to a safetensors
/// file at `path` under its own name, as F32, atomically, with metadata
/// {"format": "pt", "producer": "megatron-train"}. Vocabulary tables are cut
/// back to the model's vocab_size rows (all rows are kept when the bundle
/// has no model section), so the file loads into Hugging Face's model of the
/// same vocabulary. A tied output layer is not written, as Hugging Face's
/// save_pretrained does. Throws Error as writeSafetensors does.
void saveWeights(const std::string &path, const Bundle &bundle,
                 const host::ParameterStore &store,
                 ExpertNames experts = ExpertNames::Bundle);

/// The same for a bundle of several ranks: `ranks` holds every rank's store
/// (made for `bundle`, in world-rank order); each parameter is written whole,
/// put together from the ranks' shards at their offsets. With `experts`
/// other than Bundle, each routed expert tensor is written as one tensor
/// per expert under the hub's names (a model without routed experts is
/// written as with Bundle); a GPT-2-named expert tensor, or a shared expert
/// under Mixtral's names (Mixtral has none), is refused naming it.
void saveWeights(const std::string &path, const Bundle &bundle,
                 const std::vector<const host::ParameterStore *> &ranks,
                 ExpertNames experts = ExpertNames::Bundle);

/// The same for one process of a multi-process run (or one rank's thread):
/// every rank of `rank`'s world calls it with its own store (made for
/// `bundle` at its coordinates). Rank 0 receives, parameter by parameter,
/// the shards it lacks from one rank of each shard (not the replicas) and
/// writes the file; the others send theirs and wait until it is written. A
/// collective over the world; without `rank`, or for one rank, the
/// one-store saveWeights. Throws Error as it does; if rank 0 cannot write,
/// it aborts the world, so that every rank fails.
void saveWeights(const std::string &path, const Bundle &bundle,
                 comm::RankContext *rank, const host::ParameterStore &own,
                 ExpertNames experts = ExpertNames::Bundle);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_WEIGHTS_H
