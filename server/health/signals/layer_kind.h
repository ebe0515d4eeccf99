// What kind of layer a layer_stats entry describes (LayerStats.kind), for the
// per-layer rules: an embedding or the projection onto the vocabulary meets
// sparse, bursty gradients (a rare token's row) that are healthy there.
//
// The clients say the kind from the module's type; when a record does not,
// it is inferred from the name in every common naming family, parameter or
// module names alike (a trailing .weight / .bias is ignored; wrappers such
// as DDP's `module.` or torch.compile's `_orig_mod.` do not matter):
//   embedding: HF `model.embed_tokens`, `wpe`/`wte` (GPT-2, nanoGPT),
//     Megatron `embedding.word_embeddings`, torchtitan `tok_embeddings`, and
//     any segment holding "embed" or named emb / tok_emb / pos_emb;
//   output: `lm_head`, Megatron `output_layer`, GPT-NeoX `embed_out`,
//     torchtitan's top-level `output`, `unembed`;
//   norm: a segment holding "norm" or named ln / ln_f / ln_1 ...;
//   router: a segment named router or gate (Mixtral's
//     `block_sparse_moe.gate`, DeepSeek's `mlp.gate`; not `gate_proj`), or
//     fairseq's `wg`;
//   dense: the rest.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_LAYER_KIND_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_LAYER_KIND_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// The kind a name implies (never LAYER_KIND_UNSPECIFIED).
v1::LayerKind InferLayerKind(std::string_view name);

// Embeddings and the output head: a row per token, so a rare token's row
// sees a gradient now and then against a second moment that decayed.
inline bool IsTokenRowLayer(v1::LayerKind kind) {
  return kind == v1::EMBEDDING || kind == v1::OUTPUT;
}

// The kinds of a run's layers by name, inferred once a name (a record's
// layer_stats has the same names report after report). Bounded: past
// max_layers names each is inferred afresh. Not thread-safe.
class LayerKinds {
 public:
  explicit LayerKinds(size_t max_layers = 4096) : max_layers_(max_layers) {}
  v1::LayerKind Of(const std::string& name, const v1::LayerStats& stats) {
    if (stats.kind() != v1::LAYER_KIND_UNSPECIFIED) return stats.kind();
    auto it = inferred_.find(name);
    if (it != inferred_.end()) return it->second;
    const v1::LayerKind kind = InferLayerKind(name);
    if (inferred_.size() < max_layers_) inferred_.emplace(name, kind);
    return kind;
  }

 private:
  size_t max_layers_;
  absl::flat_hash_map<std::string, v1::LayerKind> inferred_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_LAYER_KIND_H_
