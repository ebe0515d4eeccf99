#include "ingest/wire_budget.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

namespace pb = google::protobuf;

// A message type's fields by number: what the parser makes of each.
struct WireBudget::Shape {
  struct Slot {
    bool known = false;
    bool message = false;          // a sub-message or map entry: walked
    int wire_type = 0;             // what the parser takes as this field
    const Shape* sub = nullptr;    // its shape
  };
  std::vector<Slot> slots;  // by field number; past the end: unknown
  const Slot* Find(uint64_t number) const {
    return number < slots.size() && slots[number].known ? &slots[number] : nullptr;
  }
};

namespace {

using Shape = WireBudget::Shape;

constexpr int kWireVarint = 0, kWireFixed64 = 1, kWireLen = 2, kWireStartGroup = 3,
              kWireEndGroup = 4, kWireFixed32 = 5;

bool ReadVarint(const uint8_t*& p, const uint8_t* end, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const uint8_t b = *p++;
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

enum class Walk { kOk, kMalformed, kGroup, kOverEntries };

// One field as read off the wire: its number and wire type, its varint
// value, or its length-delimited bytes [data, data + len).
struct Field {
  uint64_t number = 0;
  int wire_type = 0;
  uint64_t value = 0;           // kWireVarint
  const uint8_t* data = nullptr;  // kWireLen
  uint64_t len = 0;             // kWireLen
};

// Reads the field at `p` and moves `p` past it. False on bytes that are not
// a field, and on a group (wire type 3 or 4: `field.wire_type` says which),
// which no trainwatch.v1 message has.
bool NextField(const uint8_t*& p, const uint8_t* end, Field& field) {
  field.wire_type = -1;  // not a group, should the tag not read
  uint64_t tag = 0;
  if (!ReadVarint(p, end, tag)) return false;
  field.number = tag >> 3;
  field.wire_type = static_cast<int>(tag & 7);
  switch (field.wire_type) {
    case kWireVarint:
      return ReadVarint(p, end, field.value);
    case kWireFixed64:
      if (end - p < 8) return false;
      p += 8;
      return true;
    case kWireFixed32:
      if (end - p < 4) return false;
      p += 4;
      return true;
    case kWireLen:
      if (!ReadVarint(p, end, field.len) || field.len > static_cast<uint64_t>(end - p)) {
        return false;
      }
      field.data = p;
      p += field.len;
      return true;
    default:
      return false;
  }
}

bool IsGroup(const Field& field) {
  return field.wire_type == kWireStartGroup || field.wire_type == kWireEndGroup;
}

// Counts what parsing [p, end) as `shape` materialises into `entries`:
// every length-delimited field (sub-message, string, packed run), every
// unknown field, walking into sub-messages. Stops once over `max_entries`.
Walk Count(const Shape& shape, const uint8_t* p, const uint8_t* end, size_t max_entries,
           size_t& entries) {
  Field field;
  while (p < end) {
    if (!NextField(p, end, field)) return IsGroup(field) ? Walk::kGroup : Walk::kMalformed;
    const Shape::Slot* slot = shape.Find(field.number);
    // A field sent with a wire type other than its own is kept as an
    // unknown field: an object too.
    if (field.wire_type == kWireLen || slot == nullptr || slot->message ||
        field.wire_type != slot->wire_type) {
      ++entries;
    }
    if (entries > max_entries) return Walk::kOverEntries;
    if (field.wire_type == kWireLen && slot != nullptr && slot->message) {
      if (Walk w = Count(*slot->sub, field.data, field.data + field.len, max_entries, entries);
          w != Walk::kOk) {
        return w;
      }
    }
  }
  return Walk::kOk;
}

// A StepBatch's records and seq, without walking the records; summed over
// the batch's fields when it is sent as several.
struct BatchShape {
  uint64_t records = 0;
  uint64_t seq = 0;
};

bool ShallowBatch(const uint8_t* p, const uint8_t* end, BatchShape& batch) {
  Field field;
  while (p < end) {
    if (!NextField(p, end, field)) return false;
    if (field.number == v1::StepBatch::kSeqFieldNumber && field.wire_type == kWireVarint) {
      batch.seq = field.value;
    } else if (field.number == v1::StepBatch::kRecordsFieldNumber &&
               field.wire_type == kWireLen) {
      ++batch.records;
    }
  }
  return true;
}

}  // namespace

WireBudget::WireBudget(const ValidationLimits& limits)
    : max_batch_records_(limits.max_batch_records),
      max_entries_(limits.max_message_entries) {
  request_ = ShapeOf(v1::ReportRequest::descriptor());
}

WireBudget::~WireBudget() = default;

const WireBudget::Shape* WireBudget::ShapeOf(const pb::Descriptor* d) {
  if (auto it = built_.find(d); it != built_.end()) return it->second;
  Shape* shape = shapes_.emplace_back(std::make_unique<Shape>()).get();
  built_[d] = shape;  // before the fields: a recursive type ends here
  int max_number = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    max_number = std::max(max_number, d->field(i)->number());
  }
  shape->slots.resize(static_cast<size_t>(max_number) + 1);
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    Shape::Slot& slot = shape->slots[static_cast<size_t>(f->number())];
    slot.known = true;
    switch (f->type()) {
      case pb::FieldDescriptor::TYPE_DOUBLE:
      case pb::FieldDescriptor::TYPE_FIXED64:
      case pb::FieldDescriptor::TYPE_SFIXED64:
        slot.wire_type = kWireFixed64;
        break;
      case pb::FieldDescriptor::TYPE_FLOAT:
      case pb::FieldDescriptor::TYPE_FIXED32:
      case pb::FieldDescriptor::TYPE_SFIXED32:
        slot.wire_type = kWireFixed32;
        break;
      case pb::FieldDescriptor::TYPE_STRING:
      case pb::FieldDescriptor::TYPE_BYTES:
      case pb::FieldDescriptor::TYPE_MESSAGE:
        slot.wire_type = kWireLen;
        break;
      default:
        slot.wire_type = kWireVarint;
    }
    if (f->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      slot.message = true;
      slot.sub = ShapeOf(f->message_type());
    }
  }
  return shape;
}

absl::Status WireBudget::Check(std::string_view wire) const {
  const auto* p = reinterpret_cast<const uint8_t*>(wire.data());
  const uint8_t* end = p + wire.size();
  // Every object counted takes at least 2 bytes of the wire (a tag and a
  // length or value byte): a message of at most 2 x the budget cannot be
  // over it, and is not walked (a realistic batch of 1024 records is ~85 KB).
  const size_t most_objects = wire.size() / 2;
  if (most_objects <= max_batch_records_ && most_objects <= max_entries_) {
    return absl::OkStatus();
  }
  // The batch's records first: their own limit, and the usual message. The
  // parser merges a batch sent as several fields into one (its records
  // appended, its seq the last one's): the records are counted over all.
  Field field;
  BatchShape batch;
  for (const uint8_t* q = p; q < end && most_objects > max_batch_records_;) {
    if (!NextField(q, end, field)) break;
    if (field.number != v1::ReportRequest::kBatchFieldNumber || field.wire_type != kWireLen) {
      continue;
    }
    if (!ShallowBatch(field.data, field.data + field.len, batch)) break;
  }
  if (batch.records > max_batch_records_) {
    return absl::InvalidArgumentError(absl::StrCat("batch seq ", batch.seq, " has ",
                                                   batch.records, " records; at most ",
                                                   max_batch_records_));
  }
  if (most_objects <= max_entries_) return absl::OkStatus();
  size_t entries = 0;
  switch (Count(*request_, p, end, max_entries_, entries)) {
    case Walk::kOk:
    case Walk::kMalformed:  // the parser says what is wrong
      return absl::OkStatus();
    case Walk::kGroup:
      return absl::InvalidArgumentError(
          "the ReportRequest has a group (wire type 3 or 4), which no "
          "trainwatch.v1 message uses");
    case Walk::kOverEntries:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the ReportRequest (", wire.size(), " bytes) holds more than ", max_entries_,
      " records, layer_stats, fp8, moe entries, strings and unknown fields; "
      "it was refused before parsing: send smaller batches"));
}

}  // namespace trainwatch
