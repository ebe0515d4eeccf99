#include "health/signals/layer_kind.h"

#include <array>
#include <cctype>
#include <initializer_list>
#include <string>
#include <vector>

namespace trainwatch {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsIn(std::string_view s, std::initializer_list<std::string_view> set) {
  for (std::string_view e : set) {
    if (s == e) return true;
  }
  return false;
}

// ln, ln_f, ln_1, ln1, ln_attn ... (GPT-2, nanoGPT, GPT-NeoX).
bool IsLnSegment(std::string_view s) {
  return s == "ln" || (s.size() > 2 && s.substr(0, 2) == "ln" &&
                       (s[2] == '_' || std::isdigit(static_cast<unsigned char>(s[2]))));
}

}  // namespace

v1::LayerKind InferLayerKind(std::string_view name) {
  const std::string lower = Lower(name);
  std::vector<std::string_view> segments;
  std::string_view rest(lower);
  while (!rest.empty()) {
    const size_t dot = rest.find_first_of("./:");
    segments.push_back(rest.substr(0, dot));
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  // A parameter's name ends in its tensor: the module is what comes before.
  while (!segments.empty() && IsIn(segments.back(), {"weight", "bias", "scale", ""})) {
    segments.pop_back();
  }
  // Wrappers in front of the model's own names.
  size_t first = 0;
  while (first < segments.size() &&
         IsIn(segments[first], {"module", "_orig_mod", "_fsdp_wrapped_module", "model"})) {
    ++first;
  }
  if (segments.size() <= first) return v1::DENSE;
  // A norm inside an embedding block (BERT's embeddings.LayerNorm, BLOOM's
  // word_embeddings_layernorm) is a norm: its own segment says so.
  const std::string_view last = segments.back();
  if (last.find("norm") != std::string_view::npos || IsLnSegment(last)) return v1::NORM;
  const size_t n = segments.size();
  for (size_t i = first; i < n; ++i) {
    const std::string_view s = segments[i];
    const bool top = i <= first + 1 && i == n - 1;  // a model's own head, not a block's
    if (IsIn(s, {"lm_head", "output_layer", "embed_out", "unembed", "unembedding"}) ||
        (s == "output" && i == first) ||
        (top && IsIn(s, {"head", "fc_out", "to_logits", "logits", "generator"})) ||
        // BERT's masked-LM head: cls.predictions.decoder.
        (s == "decoder" && i == n - 1 && i > first && segments[i - 1] == "predictions")) {
      return v1::OUTPUT;
    }
    if (s.find("embed") != std::string_view::npos ||
        IsIn(s, {"wte", "wpe", "emb", "tok_emb", "pos_emb", "tok", "pos"}) ||
        // T5 and BART share one embedding between encoder and decoder.
        (s == "shared" && i == first)) {
      return v1::EMBEDDING;
    }
  }
  if (IsIn(last, {"router", "gate", "wg"})) return v1::ROUTER;
  return v1::DENSE;
}

}  // namespace trainwatch
