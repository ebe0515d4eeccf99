#include "store/codec/step_codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/descriptor.h"
#include "store/codec/bitmap.h"
#include "store/codec/bits.h"
#include "store/codec/moe_counts.h"
#include "store/codec/series.h"
#include "trainwatch/v1/clipping.h"

namespace trainwatch {
namespace {

using codec::BitReader;
using codec::BitWriter;
using codec::GetBitmap;
using codec::GetDoubles;
using codec::GetSeries;
using codec::PutBitmap;
using codec::PutDoubles;
using codec::PutSeries;
using codec::SeriesKind;
using enum codec::Predictor;
using google::protobuf::RepeatedPtrField;
using v1::StepRecord;

// The record's columns.

uint64_t Bits(double d) { return std::bit_cast<uint64_t>(d); }

// A field the client often derives from others, as its formula gives it:
// the prediction kPredicted codes against.
enum class Derived {
  kNone,
  // min(1, max_norm / (grad_norm + 1e-6)), clip_grad_norm_'s coefficient,
  // for the max_norm the chunk's first clipped record implies.
  kClipCoef,
  // The same in float32 arithmetic (ClipCoefFloat32), for a chunk whose
  // first clipped record's coefficient the double formula does not give.
  kClipCoefFloat32,
  // The client's own measure when the trainer gives none: the time since
  // the previous record, (time_unix_nanos - previous) * 1e-9.
  kStepTime,
};

struct OptionalDouble {
  const char* name;
  bool (*has)(const StepRecord&);
  double (*get)(const StepRecord&);
  void (*set)(StepRecord&, double);
  Derived derived = Derived::kNone;
};

#define TW_OPTIONAL_DOUBLE(field, ...)                              \
  OptionalDouble {                                                  \
    #field, [](const StepRecord& r) { return r.has_##field(); },    \
        [](const StepRecord& r) { return r.field(); },              \
        [](StepRecord& r, double v) { r.set_##field(v); }, __VA_ARGS__ \
  }
// The order of the columns in a blob: never reorder, only append (with a new
// format byte).
constexpr std::array<OptionalDouble, 9> kOptionalDoubles = {
    TW_OPTIONAL_DOUBLE(clip_coef, Derived::kClipCoef),
    TW_OPTIONAL_DOUBLE(loss_scale),
    TW_OPTIONAL_DOUBLE(max_attn_logit),
    TW_OPTIONAL_DOUBLE(log_z),
    TW_OPTIONAL_DOUBLE(loss),
    TW_OPTIONAL_DOUBLE(lr),
    TW_OPTIONAL_DOUBLE(shard_sq_sum),
    TW_OPTIONAL_DOUBLE(step_time_s, Derived::kStepTime),
    TW_OPTIONAL_DOUBLE(data_wait_s),
};
#undef TW_OPTIONAL_DOUBLE

using v1::ClipCoef;
using v1::ClipCoefFloat32;
using v1::kClipEpsilon;

// The max_norm that gives the first record with 0 < clip_coef < 1 its
// coefficient exactly, and the formula that does (kClipCoef, or
// kClipCoefFloat32 when the double one gives none): the shortest decimal near clip_coef * (norm + 1e-6) that
// does (a max_norm is a number someone typed). nullopt if none.
struct MaxNorm {
  double max_norm;
  Derived formula;
};
std::optional<MaxNorm> ImpliedMaxNorm(absl::Span<const uint64_t> norms,
                                      absl::Span<const uint8_t> present,
                                      absl::Span<const uint64_t> coefs) {
  for (size_t i = 0, j = 0; i < norms.size(); ++i) {
    if (!present[i]) continue;
    const uint64_t bits = coefs[j++];
    const double coef = std::bit_cast<double>(bits);
    const double norm = std::bit_cast<double>(norms[i]);
    if (!(coef > 0 && coef < 1) || !std::isfinite(norm)) continue;
    const double estimate = coef * (norm + kClipEpsilon);
    // The shortest for either formula: with 16 or 17 digits the double one
    // gives a float32 coefficient back too, from a max_norm nobody typed,
    // which predicts the chunk's other coefficients no better than nothing.
    for (int digits = 1; digits <= 17; ++digits) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.*g", digits, estimate);
      const double m = std::strtod(buf, nullptr);
      if (Bits(ClipCoef(m, norm)) == bits) return MaxNorm{m, Derived::kClipCoef};
      if (Bits(ClipCoefFloat32(m, norm)) == bits) return MaxNorm{m, Derived::kClipCoefFloat32};
    }
    return std::nullopt;
  }
  return std::nullopt;
}

// kPredicted's predictions for the present values of field f (raw bits, one
// per present value).
std::vector<uint64_t> Predictions(Derived derived, double max_norm,
                                  absl::Span<const uint8_t> present,
                                  absl::Span<const uint64_t> norms,
                                  absl::Span<const uint64_t> times) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < present.size(); ++i) {
    if (!present[i]) continue;
    double p = 0;
    if (derived == Derived::kClipCoef) {
      p = ClipCoef(max_norm, std::bit_cast<double>(norms[i]));
    } else if (derived == Derived::kClipCoefFloat32) {
      p = ClipCoefFloat32(max_norm, std::bit_cast<double>(norms[i]));
    } else if (derived == Derived::kStepTime && i > 0) {
      p = static_cast<double>(static_cast<int64_t>(times[i] - times[i - 1])) * 1e-9;
    }
    out.push_back(Bits(p));
  }
  return out;
}

// The field numbers of StepRecord the columns hold.
constexpr int kColumnFields[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16};

// Whether field `number` of StepRecord is one a column holds.
constexpr bool IsColumn(int number) {
  return std::find(std::begin(kColumnFields), std::end(kColumnFields), number) !=
         std::end(kColumnFields);
}

// StepRecord's fields that no column holds, besides layer_stats (checked
// directly, as it is the one such field today): fields added to the proto
// after this codec land here and are kept in the residue.
const std::vector<const google::protobuf::FieldDescriptor*>& OtherFields() {
  static const auto* fields = [] {
    auto* out = new std::vector<const google::protobuf::FieldDescriptor*>;
    const google::protobuf::Descriptor* d = StepRecord::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* f = d->field(i);
      if (f->number() == StepRecord::kLayerStatsFieldNumber) continue;
      if (!IsColumn(f->number())) {
        out->push_back(f);
      }
    }
    return out;
  }();
  return *fields;
}

bool HasResidue(const StepRecord& r) {
  if (r.layer_stats_size() > 0) return true;
  // Once: GetReflection() per record checks the descriptors are built.
  static const google::protobuf::Reflection* const refl = StepRecord::GetReflection();
  if (!refl->GetUnknownFields(r).empty()) return true;
  const std::vector<const google::protobuf::FieldDescriptor*>& others =
      OtherFields();
  for (const google::protobuf::FieldDescriptor* f : others) {
    if (f->is_repeated() ? refl->FieldSize(r, f) > 0 : refl->HasField(r, f)) {
      return true;
    }
  }
  return false;
}

// Copies field f of `from` (set there) into `to`, a message of its type,
// by reflection (`refl`, the type's): a field added to the proto later is
// copied too.
void CopyField(const google::protobuf::Message& from, google::protobuf::Message& to,
               const google::protobuf::Reflection* refl,
               const google::protobuf::FieldDescriptor* f) {
  using FD = google::protobuf::FieldDescriptor;
  const int n = f->is_repeated() ? refl->FieldSize(from, f) : 1;
#define TW_COPY(TYPE, Name)                                                       \
  case FD::CPPTYPE_##TYPE:                                                        \
    if (!f->is_repeated()) {                                                      \
      refl->Set##Name(&to, f, refl->Get##Name(from, f));                          \
    } else {                                                                      \
      for (int i = 0; i < n; ++i) {                                               \
        refl->Add##Name(&to, f, refl->GetRepeated##Name(from, f, i));             \
      }                                                                           \
    }                                                                             \
    return;
  switch (f->cpp_type()) {
    TW_COPY(INT32, Int32)
    TW_COPY(INT64, Int64)
    TW_COPY(UINT32, UInt32)
    TW_COPY(UINT64, UInt64)
    TW_COPY(DOUBLE, Double)
    TW_COPY(FLOAT, Float)
    TW_COPY(BOOL, Bool)
    TW_COPY(ENUM, EnumValue)
    TW_COPY(STRING, String)
    case FD::CPPTYPE_MESSAGE:
      if (!f->is_repeated()) {
        refl->MutableMessage(&to, f)->CopyFrom(refl->GetMessage(from, f));
      } else {
        for (int i = 0; i < n; ++i) {
          refl->AddMessage(&to, f)->CopyFrom(refl->GetRepeatedMessage(from, f, i));
        }
      }
      return;
  }
#undef TW_COPY
}

// A layer's report but its counts. By hand, where its fields are the seven
// written here (reflection cost as much as the copy it saved); a layer of
// a proto with more fields, or with unknown fields, is copied whole and its
// counts cleared, so nothing is ever left out.
void CopyLayerButCounts(const v1::MoeLayerStats& from, v1::MoeLayerStats& to) {
  static const bool known = v1::MoeLayerStats::descriptor()->field_count() == 7;
  static const google::protobuf::Reflection* const refl = v1::MoeLayerStats::GetReflection();
  if (!known || !refl->GetUnknownFields(from).empty()) {
    to = from;
    to.clear_tokens_per_expert();
    return;
  }
  to.set_layer(from.layer());
  if (from.has_dropped()) to.set_dropped(from.dropped());
  if (from.has_aux_loss()) to.set_aux_loss(from.aux_loss());
  if (from.has_z_loss()) to.set_z_loss(from.z_loss());
  if (!from.expert_bias().empty()) *to.mutable_expert_bias() = from.expert_bias();
  if (from.has_router_logit_max()) to.set_router_logit_max(from.router_logit_max());
}

template <typename T>
void PutFixed(T v, std::string& out) {
  static_assert(std::endian::native == std::endian::little);
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// The residue of a record whose one field besides its columns is an MoE
// report (no unknown fields anywhere, the report's and its layers' fields
// the ones written here), less the counts: the bytes SerializeAsString
// gives for it (fields in number order, proto3's presence), written
// directly. Building the message cost the store thread about a tenth of
// its time on 48-layer reports (a name copied and a message per layer, and
// the serializer). False, and nothing written, for any other record.
bool PutMoeOnlyResidue(const StepRecord& r,
                       const std::vector<const google::protobuf::FieldDescriptor*>& fields,
                       std::string& out) {
  using google::protobuf::Reflection;
  static const bool known = v1::MoeLayerStats::descriptor()->field_count() == 7 &&
                            v1::MoeStats::descriptor()->field_count() == 1;
  static const Reflection* const record_refl = StepRecord::GetReflection();
  static const Reflection* const moe_refl = v1::MoeStats::GetReflection();
  static const Reflection* const layer_refl = v1::MoeLayerStats::GetReflection();
  if (!known || !record_refl->GetUnknownFields(r).empty() ||
      !moe_refl->GetUnknownFields(r.moe()).empty()) {
    return false;
  }
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (!IsColumn(f->number()) && f->number() != StepRecord::kMoeFieldNumber) return false;
  }
  thread_local std::string layers, layer;
  layers.clear();
  for (const v1::MoeLayerStats& l : r.moe().layers()) {
    if (!layer_refl->GetUnknownFields(l).empty()) return false;
    layer.clear();
    if (!l.layer().empty()) {
      layer.push_back(0x0a);  // 1: layer, length-delimited
      PutVarint(layer, l.layer().size());
      layer.append(l.layer());
    }
    if (l.has_dropped()) {
      layer.push_back(0x18);  // 3: varint
      PutVarint(layer, l.dropped());
    }
    if (l.has_aux_loss()) {
      layer.push_back(0x21);  // 4: fixed64
      PutFixed(l.aux_loss(), layer);
    }
    if (l.has_z_loss()) {
      layer.push_back(0x29);  // 5: fixed64
      PutFixed(l.z_loss(), layer);
    }
    if (!l.expert_bias().empty()) {
      layer.push_back(0x32);  // 6: packed floats
      PutVarint(layer, 4 * static_cast<uint64_t>(l.expert_bias_size()));
      for (const float b : l.expert_bias()) PutFixed(b, layer);
    }
    if (l.has_router_logit_max()) {
      layer.push_back(0x39);  // 7: fixed64
      PutFixed(l.router_logit_max(), layer);
    }
    layers.push_back(0x0a);  // MoeStats 1: layers
    PutVarint(layers, layer.size());
    layers.append(layer);
  }
  out.push_back(static_cast<char>(0x92));  // StepRecord 18: moe, length-delimited
  out.push_back(0x01);
  PutVarint(out, layers.size());
  out.append(layers);
  return true;
}

// The record less what the columns hold (and, when `moe_counts`, less the
// MoE counts, which moe_counts.h codes), serialized. Built field by field
// rather than copied whole and cleared: a 48 x 128 report's counts (48 KB)
// were copied only to be dropped. On an arena: a report is ~100
// allocations, freed at once. A record of columns and a report only is
// written directly (PutMoeOnlyResidue).
std::string Residue(const StepRecord& r, bool moe_counts) {
  static const google::protobuf::Reflection* const refl = StepRecord::GetReflection();
  thread_local std::vector<const google::protobuf::FieldDescriptor*> fields;
  const bool split_moe = moe_counts && r.has_moe();
  fields.clear();
  refl->ListFields(r, &fields);
  if (std::string direct; split_moe && PutMoeOnlyResidue(r, fields, direct)) return direct;
  google::protobuf::Arena arena;
  StepRecord& rest = *google::protobuf::Arena::CreateMessage<StepRecord>(&arena);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (IsColumn(f->number())) continue;
    if (split_moe && f->number() == StepRecord::kMoeFieldNumber) continue;
    CopyField(r, rest, refl, f);
  }
  if (const auto& unknown = refl->GetUnknownFields(r); !unknown.empty()) {
    refl->MutableUnknownFields(&rest)->MergeFrom(unknown);
  }
  if (split_moe) {
    v1::MoeStats& moe = *rest.mutable_moe();
    static const bool moe_known = v1::MoeStats::descriptor()->field_count() == 1;
    static const google::protobuf::Reflection* const moe_refl = v1::MoeStats::GetReflection();
    if (!moe_known || !moe_refl->GetUnknownFields(r.moe()).empty()) {
      moe = r.moe();
      moe.clear_layers();
    }
    moe.mutable_layers()->Reserve(r.moe().layers_size());
    for (const v1::MoeLayerStats& layer : r.moe().layers()) {
      CopyLayerButCounts(layer, *moe.add_layers());
    }
  }
  return rest.SerializeAsString();
}


// A chunk's columns, gathered from its records in one pass. Reused by the
// thread's next chunk (Reset keeps the vectors' memory): a chunk of one
// record made ~25 allocations, most of its encoding time.
struct Columns {
  void Reset(size_t n) {
    for (auto* v : {&steps, &times, &norms, &counts, &first_ids, &inner}) {
      v->clear();
      v->reserve(n);
    }
    for (auto& p : present) p.assign(n, 0);
    for (auto& v : values) v.clear();
    for (auto* f : {&clipped_present, &skipped, &has_residue}) f->assign(n, 0);
    clipped.clear();
    residues.clear();
    reports.clear();
  }
  std::vector<uint64_t> steps, times, norms, counts, first_ids, inner;
  std::array<std::vector<uint8_t>, kOptionalDoubles.size()> present;
  std::array<std::vector<uint64_t>, kOptionalDoubles.size()> values;
  std::vector<uint8_t> clipped_present, clipped, skipped, has_residue;
  std::vector<std::string> residues;
  std::vector<const v1::MoeStats*> reports;  // of the records with one
};

// Written out rather than through kOptionalDoubles' function pointers: the
// indirect calls were a tenth of the encoder's time.
#define TW_GATHER(index, field)                                                 \
  static_assert(std::string_view(kOptionalDoubles[index].name) == #field);     \
  c.present[index][i] = r.has_##field();                                       \
  if (r.has_##field()) c.values[index].push_back(Bits(r.field()));

template <typename Get>
void Gather(size_t n, Get& at, bool moe_counts, Columns& c) {
  for (size_t i = 0; i < n; ++i) {
    const StepRecord& r = at(i);
    c.steps.push_back(r.step());
    c.times.push_back(static_cast<uint64_t>(r.time_unix_nanos()));
    c.norms.push_back(Bits(r.grad_norm()));
    TW_GATHER(0, clip_coef);
    TW_GATHER(1, loss_scale);
    TW_GATHER(2, max_attn_logit);
    TW_GATHER(3, log_z);
    TW_GATHER(4, loss);
    TW_GATHER(5, lr);
    TW_GATHER(6, shard_sq_sum);
    TW_GATHER(7, step_time_s);
    TW_GATHER(8, data_wait_s);
    c.clipped_present[i] = r.has_clipped();
    if (r.has_clipped()) c.clipped.push_back(r.clipped());
    c.skipped[i] = r.skipped();
    const auto& ids = r.batch_ids();
    c.counts.push_back(static_cast<uint64_t>(ids.size()));
    if (!ids.empty()) {
      c.first_ids.push_back(static_cast<uint64_t>(ids[0]));
      for (int j = 1; j < ids.size(); ++j) {
        c.inner.push_back(static_cast<uint64_t>(ids[j]) - static_cast<uint64_t>(ids[j - 1]));
      }
    }
    c.has_residue[i] = HasResidue(r);
    if (c.has_residue[i]) c.residues.push_back(Residue(r, moe_counts));
    if (r.has_moe()) c.reports.push_back(&r.moe());
  }
}
#undef TW_GATHER

// Whether a chunk of these records has MoE counts (format 2).
template <typename Get>
bool AnyMoeCounts(size_t n, Get&& at) {
  for (size_t i = 0; i < n; ++i) {
    if (at(i).has_moe() && codec::HasMoeCounts(at(i).moe())) return true;
  }
  return false;
}

// The MoE counts' bit stream of the chunk's reports (all the records' that
// have one), byte-aligned at the end of `out`.
void AppendMoeCounts(const std::vector<const v1::MoeStats*>& reports, std::string& out) {
  BitWriter moe(&out);
  codec::PutMoeCounts(moe, reports);
  moe.Finish();
}

// `moe_precoded`: the chunk's MoE counts coded ahead (EncodeMoeCounts of
// exactly these records), or empty.
template <typename Get>
std::string Encode(size_t n, Get&& at, std::string_view moe_precoded = {}) {
  std::string out;
  out.reserve(16 + n * 48);
  // Format 2 only for a chunk with MoE counts: the others stay readable by
  // a server that knows format 1 alone.
  const bool moe_counts = AnyMoeCounts(n, at);
  out.push_back(static_cast<char>(
      (moe_counts ? kStepChunkColumnarV2 : kStepChunkColumnarV1) | kStepChunkFloat32));
  PutVarint(out, n);
  if (n == 0) return out;
  thread_local Columns c;
  c.Reset(n);
  Gather(n, at, moe_counts, c);
  BitWriter w(&out);
  constexpr auto kInt = SeriesKind::kInteger;

  // Steps: one code per record, even when every one is zero, so a blob of B
  // bytes holds at most 8B + 1 records (the decoder's bound on a count).
  PutSeries(w, c.steps.data(), n, kInt, {kDelta, kDeltaOfDelta}, false);
  PutSeries(w, c.times.data(), n, kInt, {kDelta, kDeltaOfDelta});
  PutDoubles(w, c.norms.data(), n, {kXor, kDelta, kDeltaOfDelta, kCentered});
  // Each optional double: presence, then (clip_coef) a bit, the implied
  // max_norm's formula (a bit: float32) and the max_norm, then the values
  // present.
  for (size_t f = 0; f < kOptionalDoubles.size(); ++f) {
    Derived derived = kOptionalDoubles[f].derived;
    const std::vector<uint64_t>& col = c.values[f];
    PutBitmap(w, c.present[f]);
    std::optional<MaxNorm> max_norm;
    if (derived == Derived::kClipCoef) {
      max_norm = ImpliedMaxNorm(c.norms, c.present[f], col);
      w.Put(max_norm.has_value(), 1);
      if (max_norm.has_value()) {
        derived = max_norm->formula;
        w.Put(derived == Derived::kClipCoefFloat32, 1);
        w.Put(Bits(max_norm->max_norm), 64);
      }
    }
    if (derived == Derived::kNone || (derived == Derived::kClipCoef && !max_norm.has_value())) {
      PutDoubles(w, col.data(), col.size(), {kXor, kDelta, kDeltaOfDelta, kDelta3, kCentered});
    } else {
      const std::vector<uint64_t> pred = Predictions(
          derived, max_norm.has_value() ? max_norm->max_norm : 0, c.present[f], c.norms, c.times);
      PutDoubles(w, col.data(), col.size(),
                 {kXor, kDelta, kDeltaOfDelta, kDelta3, kCentered, kPredicted}, pred.data());
    }
  }
  // clipped: presence, then the values present.
  PutBitmap(w, c.clipped_present);
  PutBitmap(w, c.clipped);
  PutBitmap(w, c.skipped);

  // Batch ids: the count of each record, the first id of each record that
  // has one (by delta against the previous record's), and each further id
  // as its difference from the id before it in the record.
  PutSeries(w, c.counts.data(), n, kInt, {kRaw, kDelta});
  PutSeries(w, c.first_ids.data(), c.first_ids.size(), kInt, {kRaw, kDelta, kDeltaOfDelta});
  // One code per id, as for the steps: the decoder's bound on the ids.
  PutSeries(w, c.inner.data(), c.inner.size(), kInt, {kRaw, kDelta}, false);

  // Residues: which records have one, their lengths, then (after the bits,
  // byte-aligned) their bytes.
  PutBitmap(w, c.has_residue);
  std::vector<uint64_t> lengths;
  for (const std::string& r : c.residues) lengths.push_back(r.size());
  PutSeries(w, lengths.data(), lengths.size(), kInt, {kRaw, kDelta});
  w.Finish();
  for (const std::string& r : c.residues) out.append(r);
  // Format 2: the MoE counts, a bit stream of their own after the residues
  // (the reader needs the layers' names, which the residues hold).
  if (moe_counts) {
    if (moe_precoded.empty()) {
      AppendMoeCounts(c.reports, out);
    } else {
      out.append(moe_precoded);
    }
  }
  return out;
}

absl::Status Corrupt(std::string_view what, const BitReader& r) {
  return absl::DataLossError(absl::StrFormat(
      "step chunk: %s does not decode (at bit %d of %d)", what, r.bit_pos(),
      r.size_bits()));
}

// A chunk's columns, read back from its bits; the residues' bytes follow
// at `at` (relative to the bits' start).
struct ReadColumns {
  std::vector<uint64_t> steps, times, norms, counts, first_ids, inner, lengths;
  std::array<std::vector<uint8_t>, kOptionalDoubles.size()> present;
  std::array<std::vector<uint64_t>, kOptionalDoubles.size()> values;
  std::vector<uint8_t> clipped_present, clipped, skipped, has_residue;
  size_t at = 0;
};

// The record count after the format byte; `pos` moves past it.
absl::StatusOr<uint64_t> ReadCount(std::string_view blob, size_t& pos) {
  const auto* data = reinterpret_cast<const unsigned char*>(blob.data());
  uint64_t n = 0;
  for (int shift = 0;; shift += 7) {
    if (pos >= blob.size() || shift > 63) {
      return absl::DataLossError("step chunk: the record count is cut short");
    }
    const unsigned char b = data[pos++];
    n |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (b < 0x80) break;
  }
  return n;
}

// The optional doubles' presence bitmaps and values, each with the
// prediction it was coded against (`float32`: the format has
// kStepChunkFloat32, the formula's bit).
absl::Status ReadOptionalDoubles(BitReader& r, uint64_t n, bool float32, ReadColumns& c) {
  for (size_t f = 0; f < kOptionalDoubles.size(); ++f) {
    const OptionalDouble& field = kOptionalDoubles[f];
    if (!GetBitmap(r, n, c.present[f])) {
      return Corrupt(absl::StrCat("the presence of ", field.name), r);
    }
    const size_t m = std::count(c.present[f].begin(), c.present[f].end(), 1);
    Derived derived = field.derived;
    bool predicted = derived == Derived::kStepTime;
    double max_norm = 0;
    if (derived == Derived::kClipCoef && r.Get(1) != 0) {
      predicted = true;
      if (float32 && r.Get(1) != 0) derived = Derived::kClipCoefFloat32;
      max_norm = std::bit_cast<double>(r.Get(64));
    }
    std::vector<uint64_t> pred;
    if (predicted) pred = Predictions(derived, max_norm, c.present[f], c.norms, c.times);
    if (!GetDoubles(r, m, c.values[f], predicted ? pred.data() : nullptr)) {
      return Corrupt(field.name, r);
    }
  }
  return absl::OkStatus();
}

// Every column of n records from `bytes` bytes of bits (and residues, and
// with moe_counts the MoE counts after them).
absl::Status ReadAllColumns(BitReader& r, uint64_t n, size_t bytes, bool moe_counts,
                            bool float32, ReadColumns& c) {
  constexpr auto kInt = SeriesKind::kInteger;
  if (!GetSeries(r, n, kInt, c.steps)) return Corrupt("the steps", r);
  if (!GetSeries(r, n, kInt, c.times)) return Corrupt("time_unix_nanos", r);
  if (!GetDoubles(r, n, c.norms)) return Corrupt("grad_norm", r);
  if (absl::Status s = ReadOptionalDoubles(r, n, float32, c); !s.ok()) return s;
  if (!GetBitmap(r, n, c.clipped_present)) return Corrupt("the presence of clipped", r);
  const size_t clipped_n = std::count(c.clipped_present.begin(), c.clipped_present.end(), 1);
  if (!GetBitmap(r, clipped_n, c.clipped)) return Corrupt("clipped", r);
  if (!GetBitmap(r, n, c.skipped)) return Corrupt("skipped", r);
  if (!GetSeries(r, n, kInt, c.counts)) return Corrupt("the batch id counts", r);
  // Every id after a record's first costs at least a bit, so a count that
  // asks for more cannot be right (and cannot ask for more memory).
  const uint64_t max_ids = n + 8 * bytes;
  uint64_t with_ids = 0, total_ids = 0;
  for (uint64_t count : c.counts) {
    if (count > max_ids - total_ids) return Corrupt("the batch id counts", r);
    with_ids += count > 0;
    total_ids += count;
  }
  if (!GetSeries(r, with_ids, kInt, c.first_ids)) return Corrupt("the first batch ids", r);
  if (!GetSeries(r, total_ids - with_ids, kInt, c.inner)) return Corrupt("the batch ids", r);
  if (!GetBitmap(r, n, c.has_residue)) return Corrupt("the residue bitmap", r);
  const size_t residue_n = std::count(c.has_residue.begin(), c.has_residue.end(), 1);
  if (!GetSeries(r, residue_n, kInt, c.lengths)) return Corrupt("the residue lengths", r);
  c.at = r.AlignToByte();
  uint64_t residue_bytes = 0;
  for (uint64_t len : c.lengths) {
    residue_bytes += len;
    if (len > bytes || residue_bytes > bytes) return Corrupt("the residue lengths", r);
  }
  if (moe_counts ? c.at + residue_bytes > bytes : c.at + residue_bytes != bytes) {
    return absl::DataLossError(absl::StrCat(
        "step chunk: ", bytes - c.at, " bytes after the columns, ", residue_bytes,
        " expected"));
  }
  return absl::OkStatus();
}

// The records from their columns and residues (`bits` the columns' first
// byte); c.at moves past the residues.
absl::Status Assemble(const unsigned char* bits, uint64_t n, ReadColumns& c,
                      RepeatedPtrField<StepRecord>* out) {
  out->Reserve(static_cast<int>(n));
  std::array<size_t, kOptionalDoubles.size()> next{};
  size_t next_clipped = 0, next_first = 0, next_inner = 0, next_residue = 0;
  for (size_t i = 0; i < n; ++i) {
    StepRecord& rec = *out->Add();
    if (c.has_residue[i]) {
      const uint64_t len = c.lengths[next_residue++];
      if (!rec.ParseFromArray(bits + c.at, static_cast<int>(len))) {
        return absl::DataLossError(absl::StrCat(
            "step chunk: the residue of record ", i, " does not parse"));
      }
      c.at += len;
    }
    rec.set_step(c.steps[i]);
    rec.set_time_unix_nanos(static_cast<int64_t>(c.times[i]));
    rec.set_grad_norm(std::bit_cast<double>(c.norms[i]));
    for (size_t f = 0; f < kOptionalDoubles.size(); ++f) {
      if (c.present[f][i]) {
        kOptionalDoubles[f].set(rec, std::bit_cast<double>(c.values[f][next[f]++]));
      }
    }
    if (c.clipped_present[i]) rec.set_clipped(c.clipped[next_clipped++] != 0);
    rec.set_skipped(c.skipped[i] != 0);
    if (c.counts[i] > 0) {
      auto* ids = rec.mutable_batch_ids();
      ids->Reserve(static_cast<int>(c.counts[i]));
      uint64_t id = c.first_ids[next_first++];
      ids->Add(static_cast<int64_t>(id));
      for (uint64_t j = 1; j < c.counts[i]; ++j) {
        id += c.inner[next_inner++];
        ids->Add(static_cast<int64_t>(id));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeColumnar(std::string_view blob, bool moe_counts, bool float32,
                            RepeatedPtrField<StepRecord>* out) {
  const auto* data = reinterpret_cast<const unsigned char*>(blob.data());
  size_t pos = 1;
  const absl::StatusOr<uint64_t> count = ReadCount(blob, pos);
  if (!count.ok()) return count.status();
  const uint64_t n = *count;
  const size_t bytes = blob.size() - pos;
  if (n == 0) {
    if (bytes != 0) return absl::DataLossError("step chunk: bytes after an empty chunk");
    return absl::OkStatus();
  }
  if (n > 8 * bytes + 1) {
    return absl::DataLossError(absl::StrCat(
        "step chunk: ", n, " records cannot fit in ", blob.size(), " bytes"));
  }
  BitReader r(data + pos, bytes);
  ReadColumns c;
  if (absl::Status s = ReadAllColumns(r, n, bytes, moe_counts, float32, c); !s.ok()) return s;
  if (absl::Status s = Assemble(data + pos, n, c, out); !s.ok()) return s;
  if (!moe_counts) return absl::OkStatus();
  std::vector<v1::MoeStats*> reports;
  for (StepRecord& rec : *out) {
    if (rec.has_moe()) reports.push_back(rec.mutable_moe());
  }
  const size_t at = c.at;
  BitReader moe(data + pos + at, bytes - at);
  if (!codec::GetMoeCounts(moe, reports)) return Corrupt("the MoE counts", moe);
  if (moe.AlignToByte() != bytes - at) {
    return absl::DataLossError(absl::StrCat(
        "step chunk: ", bytes - at - moe.AlignToByte(), " bytes after the MoE counts"));
  }
  return absl::OkStatus();
}

}  // namespace

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

std::string EncodeStepChunk(const RepeatedPtrField<StepRecord>& records) {
  return Encode(static_cast<size_t>(records.size()),
                [&](size_t i) -> const StepRecord& { return records[static_cast<int>(i)]; });
}

std::string EncodeStepChunk(const RepeatedPtrField<StepRecord>& records,
                            absl::Span<const size_t> indices, std::string_view moe_counts) {
  bool all = indices.size() == static_cast<size_t>(records.size());
  for (size_t i = 0; i < indices.size() && all; ++i) all = indices[i] == i;
  return Encode(
      indices.size(),
      [&](size_t i) -> const StepRecord& { return records[static_cast<int>(indices[i])]; },
      all ? moe_counts : std::string_view());
}

std::string EncodeMoeCounts(const RepeatedPtrField<StepRecord>& records) {
  std::string out;
  const auto at = [&](size_t i) -> const StepRecord& { return records[static_cast<int>(i)]; };
  if (!AnyMoeCounts(static_cast<size_t>(records.size()), at)) return out;
  std::vector<const v1::MoeStats*> reports;
  for (const StepRecord& r : records) {
    if (r.has_moe()) reports.push_back(&r.moe());
  }
  AppendMoeCounts(reports, out);
  return out;
}

absl::Status DecodeStepChunk(std::string_view blob,
                             RepeatedPtrField<StepRecord>* out) {
  out->Clear();
  const unsigned char format =
      blob.empty() ? 0 : static_cast<unsigned char>(blob[0]) & ~kStepChunkFloat32;
  const bool float32 = !blob.empty() && (blob[0] & kStepChunkFloat32) != 0;
  if (format == kStepChunkColumnarV1) return DecodeColumnar(blob, false, float32, out);
  if (format == kStepChunkColumnarV2) return DecodeColumnar(blob, true, float32, out);
  if (!blob.empty() && (blob[0] & 7) >= 6) {
    return absl::DataLossError(absl::StrFormat(
        "step chunk: unknown format byte 0x%02x (written by a newer server?)",
        static_cast<unsigned char>(blob[0])));
  }
  // Written before the columnar format: a serialized StepBatch.
  v1::StepBatch batch;
  if (!batch.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError("step chunk: a StepBatch chunk does not parse");
  }
  out->Swap(batch.mutable_records());
  return absl::OkStatus();
}

}  // namespace trainwatch
