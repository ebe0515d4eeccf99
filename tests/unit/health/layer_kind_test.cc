// InferLayerKind on the naming families trainers use (parameter and module
// names alike), and LayerKinds' precedence of what the client said.
#include "health/signals/layer_kind.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace trainwatch {
namespace {

struct Case {
  const char* name;
  v1::LayerKind kind;
};

TEST(InferLayerKind, KnowsEveryCommonNamingFamily) {
  const std::vector<Case> cases = {
      // Hugging Face (Llama, Mistral, Qwen), parameters and modules.
      {"model.embed_tokens.weight", v1::EMBEDDING},
      {"model.embed_tokens", v1::EMBEDDING},
      {"lm_head.weight", v1::OUTPUT},
      {"lm_head", v1::OUTPUT},
      {"model.layers.0.self_attn.q_proj.weight", v1::DENSE},
      {"model.layers.3.mlp.gate_proj.weight", v1::DENSE},
      {"model.layers.0.input_layernorm.weight", v1::NORM},
      {"model.norm.weight", v1::NORM},
      {"model.layers.1.block_sparse_moe.gate.weight", v1::ROUTER},
      {"model.layers.1.mlp.gate.weight", v1::ROUTER},
      // Megatron-LM / Megatron-Core.
      {"embedding.word_embeddings.weight", v1::EMBEDDING},
      {"embedding.position_embeddings.weight", v1::EMBEDDING},
      {"output_layer.weight", v1::OUTPUT},
      {"decoder.layers.0.self_attention.linear_qkv.weight", v1::DENSE},
      {"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", v1::NORM},
      {"decoder.final_layernorm.weight", v1::NORM},
      {"decoder.layers.2.mlp.router.weight", v1::ROUTER},
      // GPT-2 / nanoGPT (wte tied to lm_head).
      {"transformer.wte.weight", v1::EMBEDDING},
      {"transformer.wpe.weight", v1::EMBEDDING},
      {"transformer.h.0.attn.c_attn.weight", v1::DENSE},
      {"transformer.h.0.ln_1.weight", v1::NORM},
      {"transformer.ln_f.bias", v1::NORM},
      // torchtitan.
      {"tok_embeddings.weight", v1::EMBEDDING},
      {"tok_embeddings", v1::EMBEDDING},
      {"output.weight", v1::OUTPUT},
      {"output", v1::OUTPUT},
      {"layers.0.attention.wq.weight", v1::DENSE},
      {"layers.0.attention_norm.weight", v1::NORM},
      {"norm.weight", v1::NORM},
      // GPT-NeoX, fairseq's MoE gate, wrappers (DDP, torch.compile).
      {"gpt_neox.embed_in.weight", v1::EMBEDDING},
      {"embed_out.weight", v1::OUTPUT},
      {"decoder.layers.1.moe_layer.gate.wg.weight", v1::ROUTER},
      {"module._orig_mod.transformer.wte.weight", v1::EMBEDDING},
      {"module.lm_head.weight", v1::OUTPUT},
      // The project's lab and the old module-name list.
      {"emb", v1::EMBEDDING},
      {"tok", v1::EMBEDDING},
      {"pos", v1::EMBEDDING},
      {"head", v1::OUTPUT},
      {"blocks.0.attn", v1::DENSE},
      // An "output" inside a block is a dense projection (BERT).
      {"bert.encoder.layer.0.output.dense.weight", v1::DENSE},
      {"bert.encoder.layer.0.attention.output.LayerNorm.weight", v1::NORM},
      // BERT's embedding norm and masked-LM head, BLOOM, T5 / BART, and a
      // minimal transformer's head onto the vocabulary.
      {"bert.embeddings.LayerNorm.weight", v1::NORM},
      {"bert.embeddings.word_embeddings.weight", v1::EMBEDDING},
      {"cls.predictions.decoder.weight", v1::OUTPUT},
      {"cls.predictions.transform.dense.weight", v1::DENSE},
      {"transformer.word_embeddings_layernorm.weight", v1::NORM},
      {"shared.weight", v1::EMBEDDING},
      {"model.shared.weight", v1::EMBEDDING},
      {"encoder.block.0.layer.0.SelfAttention.q.weight", v1::DENSE},
      {"fc_out.weight", v1::OUTPUT},
      {"decoder.fc_out.weight", v1::OUTPUT},
      {"decoder.layers.0.fc_out.weight", v1::DENSE},
      {"model.decoder.final_layer_norm.weight", v1::NORM},
      {"backbone.embedding.weight", v1::EMBEDDING},
      {"backbone.norm_f.weight", v1::NORM},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(InferLayerKind(c.name), c.kind)
        << c.name << ": " << v1::LayerKind_Name(InferLayerKind(c.name));
  }
}

TEST(LayerKinds, WhatTheClientSaidWinsOverTheName) {
  LayerKinds kinds;
  v1::LayerStats said;
  said.set_kind(v1::EMBEDDING);
  // A module the client knows is an embedding whatever its name.
  EXPECT_EQ(kinds.Of("blocks.0.lookup", said), v1::EMBEDDING);
  v1::LayerStats unsaid;
  EXPECT_EQ(kinds.Of("blocks.0.lookup", unsaid), v1::DENSE);
  EXPECT_EQ(kinds.Of("model.embed_tokens.weight", unsaid), v1::EMBEDDING);
  // Cached by name: the same answer the second time.
  EXPECT_EQ(kinds.Of("model.embed_tokens.weight", unsaid), v1::EMBEDDING);
}

}  // namespace
}  // namespace trainwatch
