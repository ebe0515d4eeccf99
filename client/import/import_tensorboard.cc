#include "import/import_tensorboard.h"

#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "import/import_files.h"

namespace trainwatch::cli {
namespace {

using google::protobuf::io::CodedInputStream;
using WFL = google::protobuf::internal::WireFormatLite;

// Field numbers of tensorflow/core/util/event.proto, summary.proto and
// tensor.proto that scalars use.
constexpr int kEventStep = 2;
constexpr int kEventSummary = 5;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1;
constexpr int kValueSimple = 2;
constexpr int kValueTensor = 8;
constexpr int kValueMetadata = 9;
constexpr int kMetadataPluginData = 1;
constexpr int kPluginName = 1;
constexpr int kTensorDtype = 1;
constexpr int kTensorShape = 2;
constexpr int kTensorContent = 4;
constexpr int kTensorFloatVal = 5;
constexpr int kTensorDoubleVal = 6;
constexpr int kShapeDim = 2;
constexpr int kDtFloat = 1;
constexpr int kDtDouble = 2;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

uint64_t LoadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A length-delimited field's bytes.
bool ReadBytes(CodedInputStream* in, std::string* out) {
  uint32_t size = 0;
  return in->ReadVarint32(&size) && in->ReadString(out, size);
}

// The value of a scalar tensor of float or double, if it is one. Text and
// other plugins store strings (DT_STRING) and are skipped.
std::optional<double> ScalarTensor(const std::string& bytes) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  int dtype = 0;
  bool scalar_shape = true;
  std::optional<double> value;
  std::string content;
  while (uint32_t tag = in.ReadTag()) {
    const int field = WFL::GetTagFieldNumber(tag);
    const auto wire = WFL::GetTagWireType(tag);
    if (field == kTensorDtype && wire == WFL::WIRETYPE_VARINT) {
      uint32_t v;
      if (!in.ReadVarint32(&v)) return std::nullopt;
      dtype = static_cast<int>(v);
    } else if (field == kTensorShape &&
               wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
      std::string shape;
      if (!ReadBytes(&in, &shape)) return std::nullopt;
      // A dim of size 1 is still one value; anything larger is not a scalar.
      CodedInputStream s(reinterpret_cast<const uint8_t*>(shape.data()),
                         static_cast<int>(shape.size()));
      while (uint32_t t = s.ReadTag()) {
        if (WFL::GetTagFieldNumber(t) == kShapeDim &&
            WFL::GetTagWireType(t) == WFL::WIRETYPE_LENGTH_DELIMITED) {
          std::string dim;
          if (!ReadBytes(&s, &dim)) return std::nullopt;
          CodedInputStream d(reinterpret_cast<const uint8_t*>(dim.data()),
                             static_cast<int>(dim.size()));
          while (uint32_t dt = d.ReadTag()) {
            if (WFL::GetTagFieldNumber(dt) == 1 &&
                WFL::GetTagWireType(dt) == WFL::WIRETYPE_VARINT) {
              uint64_t n;
              if (!d.ReadVarint64(&n)) return std::nullopt;
              if (n != 1) scalar_shape = false;
            } else if (!WFL::SkipField(&d, dt)) {
              return std::nullopt;
            }
          }
        } else if (!WFL::SkipField(&s, t)) {
          return std::nullopt;
        }
      }
    } else if (field == kTensorContent &&
               wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadBytes(&in, &content)) return std::nullopt;
    } else if (field == kTensorFloatVal) {
      float f;
      if (wire == WFL::WIRETYPE_LENGTH_DELIMITED) {  // packed
        std::string packed;
        if (!ReadBytes(&in, &packed) || packed.size() < 4) return std::nullopt;
        std::memcpy(&f, packed.data(), 4);
      } else if (wire == WFL::WIRETYPE_FIXED32) {
        uint32_t bits;
        if (!in.ReadLittleEndian32(&bits)) return std::nullopt;
        std::memcpy(&f, &bits, 4);
      } else {
        return std::nullopt;
      }
      value = f;
    } else if (field == kTensorDoubleVal) {
      double v;
      if (wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
        std::string packed;
        if (!ReadBytes(&in, &packed) || packed.size() < 8) return std::nullopt;
        std::memcpy(&v, packed.data(), 8);
      } else if (wire == WFL::WIRETYPE_FIXED64) {
        uint64_t bits;
        if (!in.ReadLittleEndian64(&bits)) return std::nullopt;
        std::memcpy(&v, &bits, 8);
      } else {
        return std::nullopt;
      }
      value = v;
    } else if (!WFL::SkipField(&in, tag)) {
      return std::nullopt;
    }
  }
  if (!scalar_shape) return std::nullopt;
  if (dtype == kDtFloat) {
    if (value.has_value()) return value;
    if (content.size() == 4) {
      float f;
      std::memcpy(&f, content.data(), 4);
      return f;
    }
  } else if (dtype == kDtDouble) {
    if (value.has_value()) return value;
    if (content.size() == 8) {
      double d;
      std::memcpy(&d, content.data(), 8);
      return d;
    }
  }
  return std::nullopt;
}

// The plugin a Summary.Value's metadata names ("scalars", "text", ...).
std::string PluginName(const std::string& metadata) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(metadata.data()),
                      static_cast<int>(metadata.size()));
  while (uint32_t tag = in.ReadTag()) {
    if (WFL::GetTagFieldNumber(tag) == kMetadataPluginData &&
        WFL::GetTagWireType(tag) == WFL::WIRETYPE_LENGTH_DELIMITED) {
      std::string plugin;
      if (!ReadBytes(&in, &plugin)) return "";
      CodedInputStream p(reinterpret_cast<const uint8_t*>(plugin.data()),
                         static_cast<int>(plugin.size()));
      while (uint32_t t = p.ReadTag()) {
        if (WFL::GetTagFieldNumber(t) == kPluginName &&
            WFL::GetTagWireType(t) == WFL::WIRETYPE_LENGTH_DELIMITED) {
          std::string name;
          return ReadBytes(&p, &name) ? name : "";
        }
        if (!WFL::SkipField(&p, t)) return "";
      }
      return "";
    }
    if (!WFL::SkipField(&in, tag)) return "";
  }
  return "";
}

// Parses one Summary.Value; false when it is malformed.
bool ParseValue(const std::string& bytes, int64_t step,
                const std::function<void(const ScalarPoint&)>& fn) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  std::string tag_name, tensor, metadata;
  std::optional<double> simple;
  while (uint32_t tag = in.ReadTag()) {
    const int field = WFL::GetTagFieldNumber(tag);
    const auto wire = WFL::GetTagWireType(tag);
    if (field == kValueTag && wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadBytes(&in, &tag_name)) return false;
    } else if (field == kValueSimple && wire == WFL::WIRETYPE_FIXED32) {
      uint32_t bits;
      if (!in.ReadLittleEndian32(&bits)) return false;
      float f;
      std::memcpy(&f, &bits, 4);
      simple = f;
    } else if (field == kValueTensor &&
               wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadBytes(&in, &tensor)) return false;
    } else if (field == kValueMetadata &&
               wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadBytes(&in, &metadata)) return false;
    } else if (!WFL::SkipField(&in, tag)) {
      return false;
    }
  }
  if (!in.ConsumedEntireMessage()) return false;
  if (!simple.has_value() && !tensor.empty()) {
    const std::string plugin = PluginName(metadata);
    if (plugin.empty() || plugin == "scalars") simple = ScalarTensor(tensor);
  }
  if (simple.has_value()) fn({tag_name, step, *simple});
  return true;
}

// Parses one Event; false when it is malformed.
bool ParseEvent(absl::string_view data,
                const std::function<void(const ScalarPoint&)>& fn) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(data.data()),
                      static_cast<int>(data.size()));
  int64_t step = 0;
  std::string summary;
  bool has_summary = false;
  while (uint32_t tag = in.ReadTag()) {
    const int field = WFL::GetTagFieldNumber(tag);
    const auto wire = WFL::GetTagWireType(tag);
    if (field == kEventStep && wire == WFL::WIRETYPE_VARINT) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return false;
      step = static_cast<int64_t>(v);
    } else if (field == kEventSummary &&
               wire == WFL::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadBytes(&in, &summary)) return false;
      has_summary = true;
    } else if (!WFL::SkipField(&in, tag)) {
      return false;
    }
  }
  if (!in.ConsumedEntireMessage()) return false;
  if (!has_summary) return true;
  CodedInputStream s(reinterpret_cast<const uint8_t*>(summary.data()),
                     static_cast<int>(summary.size()));
  while (uint32_t tag = s.ReadTag()) {
    if (WFL::GetTagFieldNumber(tag) == kSummaryValue &&
        WFL::GetTagWireType(tag) == WFL::WIRETYPE_LENGTH_DELIMITED) {
      std::string value;
      if (!ReadBytes(&s, &value) || !ParseValue(value, step, fn)) return false;
    } else if (!WFL::SkipField(&s, tag)) {
      return false;
    }
  }
  return s.ConsumedEntireMessage();
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (char c : data) {
    crc = table[(crc ^ static_cast<uint8_t>(c)) & 0xFF] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskCrc(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

bool LooksLikeTfRecord(absl::string_view bytes) {
  return bytes.size() >= 12 &&
         LoadLe32(bytes.data() + 8) == MaskCrc(Crc32c(bytes.substr(0, 8)));
}

absl::Status ReadEventScalars(absl::string_view bytes, absl::string_view name,
                              const std::function<void(const ScalarPoint&)>& fn,
                              int64_t* truncated_at) {
  size_t offset = 0;
  while (offset < bytes.size()) {
    const absl::string_view rest = bytes.substr(offset);
    if (rest.size() < 12) {
      if (truncated_at != nullptr) *truncated_at = static_cast<int64_t>(offset);
      return absl::OkStatus();
    }
    const uint64_t length = LoadLe64(rest.data());
    if (LoadLe32(rest.data() + 8) != MaskCrc(Crc32c(rest.substr(0, 8)))) {
      return absl::DataLossError(absl::StrCat(
          name, ":offset ", offset,
          ": record length CRC mismatch (corrupt file, or not a TensorBoard "
          "event file)"));
    }
    if (length > rest.size() - 12 || rest.size() - 12 - length < 4) {
      if (truncated_at != nullptr) *truncated_at = static_cast<int64_t>(offset);
      return absl::OkStatus();
    }
    const absl::string_view data = rest.substr(12, length);
    if (LoadLe32(rest.data() + 12 + length) != MaskCrc(Crc32c(data))) {
      return absl::DataLossError(absl::StrCat(
          name, ":offset ", offset, ": record data CRC mismatch (corrupt file)"));
    }
    // Points are delivered only once the whole Event parsed.
    std::vector<std::pair<std::string, ScalarPoint>> points;
    if (!ParseEvent(data, [&](const ScalarPoint& p) {
          points.push_back({std::string(p.tag), p});
        })) {
      return absl::DataLossError(absl::StrCat(
          name, ":offset ", offset, ": record is not a valid Event proto"));
    }
    for (auto& [tag, p] : points) {
      p.tag = tag;
      fn(p);
    }
    offset += 12 + length + 4;
  }
  return absl::OkStatus();
}

absl::Status ImportTensorBoard(const std::string& path, const TagMap& map,
                               LoggedRun* run) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  std::map<std::string, uint64_t> ignored;  // tag -> points
  std::map<LogSource, uint64_t> sources;
  int64_t truncated_at = -1;
  absl::Status status = ReadEventScalars(
      *bytes, path,
      [&](const ScalarPoint& p) {
        std::optional<TagTarget> target = LookUpTag(p.tag, map);
        if (!target.has_value() || p.step < 0) {
          ++ignored[std::string(p.tag)];
          return;
        }
        ++sources[SourceOfTag(p.tag)];
        run->Set(static_cast<uint64_t>(p.step), *target, p.value);
      },
      &truncated_at);
  if (!status.ok()) return status;
  if (truncated_at >= 0) {
    run->notes.push_back(absl::StrCat(
        path, ": truncated at offset ", truncated_at, " of ", bytes->size(),
        " bytes (an unfinished last record, as when the writer was killed); "
        "the records before it are imported"));
  }
  if (!ignored.empty()) {
    std::vector<std::string> names;
    for (const auto& [tag, n] : ignored) names.push_back(tag);
    if (names.size() > 12) {
      names.resize(12);
      names.push_back("...");
    }
    run->notes.push_back(absl::StrCat(
        path, ": ", ignored.size(), " scalar tags not used (",
        absl::StrJoin(names, ", "), "); map one with --map TAG=field"));
  }
  for (const auto& [source, n] : sources) {
    if (source != LogSource::kUnknown && run->source == LogSource::kUnknown) {
      run->source = source;
    }
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
