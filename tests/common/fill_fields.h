// Fills every field of a protobuf message by reflection, for the tests that
// check a conversion carries every field: a field added to the proto is
// filled too, so a conversion that does not carry it fails them.
#ifndef TRAINWATCH_TESTS_COMMON_FILL_FIELDS_H_
#define TRAINWATCH_TESTS_COMMON_FILL_FIELDS_H_

#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace trainwatch::testing {

namespace fill_internal {

// Sets (or, for a repeated field, adds) entry `i` of scalar field `f`: a
// value of its own, not the default, that survives JSON (halves are exact
// in a float).
inline void SetScalar(google::protobuf::Message* m,
                      const google::protobuf::FieldDescriptor* f, int i) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  const bool add = f->is_repeated();
  const int n = f->number() * 10 + i + 1;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      add ? r->AddInt32(m, f, n) : r->SetInt32(m, f, n);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      add ? r->AddInt64(m, f, n) : r->SetInt64(m, f, n);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      add ? r->AddUInt32(m, f, n) : r->SetUInt32(m, f, n);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      add ? r->AddUInt64(m, f, n) : r->SetUInt64(m, f, n);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      add ? r->AddDouble(m, f, n + 0.5) : r->SetDouble(m, f, n + 0.5);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      add ? r->AddFloat(m, f, n + 0.5f) : r->SetFloat(m, f, n + 0.5f);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      add ? r->AddBool(m, f, true) : r->SetBool(m, f, true);
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      // The last value: never the default (0, *_UNSPECIFIED).
      const auto* e = f->enum_type();
      const int v = e->value(e->value_count() - 1)->number();
      add ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = f->name() + "-" + std::to_string(i + 1);
      add ? r->AddString(m, f, s) : r->SetString(m, f, s);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // FillEveryField's
  }
}

}  // namespace fill_internal

// Sets every field of `message` to a value that is not its default:
// each scalar one of its own (from its field number), each enum its last
// value, each string "<name>-1", each repeated field and map two entries,
// each sub-message (a map's values too) filled the same way.
inline void FillEveryField(google::protobuf::Message* message) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = message->GetDescriptor();
  const google::protobuf::Reflection* r = message->GetReflection();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    const int entries = f->is_repeated() ? 2 : 1;
    for (int i = 0; i < entries; ++i) {
      if (f->is_map()) {
        google::protobuf::Message* entry = r->AddMessage(message, f);
        const FieldDescriptor* key = f->message_type()->map_key();
        const FieldDescriptor* value = f->message_type()->map_value();
        fill_internal::SetScalar(entry, key, i);
        if (value->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          FillEveryField(entry->GetReflection()->MutableMessage(entry, value));
        } else {
          fill_internal::SetScalar(entry, value, i);
        }
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        FillEveryField(f->is_repeated() ? r->AddMessage(message, f)
                                        : r->MutableMessage(message, f));
      } else {
        fill_internal::SetScalar(message, f, i);
      }
    }
  }
}

template <typename T>
T FilledMessage() {
  T message;
  FillEveryField(&message);
  return message;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_COMMON_FILL_FIELDS_H_
