// The config.json of transformers that describes a bundle's model, for
// megatron-checkpoint export-hf: derived from the bundle's model section, its
// parameters (names and global shapes) and the attributes of its rope, norm
// and GeLU instructions, so it says exactly what the bundle computes.
#ifndef MTRT_SRC_TRAIN_HUGGINGFACECONFIG_H
#define MTRT_SRC_TRAIN_HUGGINGFACECONFIG_H

#include "core/Bundle.h"

#include <nlohmann/json.hpp>

namespace mtrt::train {

/// transformers' config.json for the bundle's model, in the form of its
/// family: GPT2Config (transformer.* names), LlamaConfig, Qwen2Config
/// (biases on q, k and v alone) or Qwen3Config (q_norm and k_norm). Throws
/// Error (INVALID_ARGUMENT) naming what no such class describes (GPT-2
/// names with SwiGLU or RMSNorm, say).
nlohmann::json huggingFaceConfig(const Bundle &bundle);

/// The generation_config.json that save_pretrained writes beside it for a
/// config without generation settings.
nlohmann::json huggingFaceGenerationConfig();

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_HUGGINGFACECONFIG_H
