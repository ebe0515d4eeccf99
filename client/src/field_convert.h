// How each shape of a field table (trainwatch/step_fields.h) converts, as
// macros over one field `name`:
//   TW_TO_WIRE:   from `in`, a client struct, into `out`, a proto message*;
//   TW_FROM_WIRE: from `in`, a proto message, into `out`, a client struct*.
// A table expands into a conversion with TW_APPLY(TABLE, TW_TO_WIRE) in a
// function of namespace trainwatch::internal that has ToWire / FromWire
// overloads for the table's sub-messages (and strings, the values of a
// map<string, string>). A field whose name or type differs between the
// struct and the proto does not compile (ToWireValue's static_assert).
#ifndef TRAINWATCH_CLIENT_SRC_FIELD_CONVERT_H_
#define TRAINWATCH_CLIENT_SRC_FIELD_CONVERT_H_

#include <string>
#include <type_traits>
#include <vector>

#include "google/protobuf/repeated_field.h"

namespace trainwatch::internal {

// A value as the proto holds it: the same type, or an enum class as the
// proto enum of the same values.
template <typename Wire, typename Client>
Wire ToWireValue(const Client& value) {
  if constexpr (std::is_enum_v<Client>) {
    static_assert(std::is_enum_v<Wire>, "an enum class is a proto enum");
    return static_cast<Wire>(value);
  } else {
    static_assert(std::is_same_v<Wire, Client>,
                  "a field has one type in the client struct and the proto");
    return value;
  }
}

template <typename Client, typename Wire>
Client FromWireValue(const Wire& value) {
  if constexpr (std::is_enum_v<Client>) {
    static_assert(std::is_enum_v<Wire>, "an enum class is a proto enum");
    return static_cast<Client>(value);
  } else {
    static_assert(std::is_same_v<Wire, Client>,
                  "a field has one type in the client struct and the proto");
    return value;
  }
}

template <typename T, typename W>
void AddAll(const std::vector<T>& in, google::protobuf::RepeatedField<W>* out) {
  static_assert(std::is_same_v<T, W>,
                "a field has one type in the client struct and the proto");
  out->Add(in.begin(), in.end());
}

template <typename T, typename W>
void AssignAll(const google::protobuf::RepeatedField<W>& in, std::vector<T>* out) {
  static_assert(std::is_same_v<T, W>,
                "a field has one type in the client struct and the proto");
  out->assign(in.begin(), in.end());
}

// A repeated message: each element through `convert` (the ToWire / FromWire
// of the table's function, which a template here cannot name).
template <typename T, typename W, typename Convert>
void AddAll(const std::vector<T>& in, google::protobuf::RepeatedPtrField<W>* out,
            Convert convert) {
  for (const T& value : in) convert(value, out->Add());
}

template <typename T, typename W, typename Convert>
void AssignAll(const google::protobuf::RepeatedPtrField<W>& in, std::vector<T>* out,
               Convert convert) {
  out->clear();
  for (const W& value : in) convert(value, &out->emplace_back());
}

// A repeated scalar (the converter is not needed).
template <typename T, typename W, typename Convert>
void AddAll(const std::vector<T>& in, google::protobuf::RepeatedField<W>* out, Convert) {
  AddAll(in, out);
}

template <typename T, typename W, typename Convert>
void AssignAll(const google::protobuf::RepeatedField<W>& in, std::vector<T>* out, Convert) {
  AssignAll(in, out);
}

// The values of a map<string, string>.
inline void ToWire(const std::string& in, std::string* out) { *out = in; }
inline void FromWire(const std::string& in, std::string* out) { *out = in; }

}  // namespace trainwatch::internal

// TABLE(...) with the shape macros a conversion names (TW_TO_WIRE).
#define TW_APPLY(TABLE, ...) TABLE(__VA_ARGS__)

#define TW_WIRE_TYPE_(name) std::remove_cvref_t<decltype(out->name())>

#define TW_TO_WIRE_VALUE(name) \
  out->set_##name(::trainwatch::internal::ToWireValue<TW_WIRE_TYPE_(name)>(in.name));
#define TW_TO_WIRE_OPTIONAL(name)                                               \
  if (in.name.has_value()) {                                                    \
    out->set_##name(::trainwatch::internal::ToWireValue<TW_WIRE_TYPE_(name)>(   \
        *in.name));                                                             \
  }
#define TW_TO_WIRE_MESSAGE(name) \
  if (in.name.has_value()) ToWire(*in.name, out->mutable_##name());
#define TW_TO_WIRE_REPEATED(name)                                \
  ::trainwatch::internal::AddAll(in.name, out->mutable_##name(), \
                                 [](const auto& v, auto* o) { ToWire(v, o); });
#define TW_TO_WIRE_MAP(name) \
  for (const auto& [key, value] : in.name) ToWire(value, &(*out->mutable_##name())[key]);
#define TW_TO_WIRE_WRAPPED(name, inner) \
  for (const auto& value : in.name) ToWire(value, out->mutable_##name()->add_##inner());
#define TW_TO_WIRE                                                       \
  TW_TO_WIRE_VALUE, TW_TO_WIRE_OPTIONAL, TW_TO_WIRE_MESSAGE,             \
      TW_TO_WIRE_REPEATED, TW_TO_WIRE_MAP, TW_TO_WIRE_WRAPPED

#define TW_FROM_WIRE_VALUE(name)                                             \
  out->name = ::trainwatch::internal::FromWireValue<decltype(out->name)>(   \
      in.name());
#define TW_FROM_WIRE_OPTIONAL(name)                                         \
  out->name.reset();                                                        \
  if (in.has_##name()) {                                                    \
    out->name = ::trainwatch::internal::FromWireValue<                      \
        typename decltype(out->name)::value_type>(in.name());               \
  }
#define TW_FROM_WIRE_MESSAGE(name) \
  out->name.reset();               \
  if (in.has_##name()) FromWire(in.name(), &out->name.emplace());
#define TW_FROM_WIRE_REPEATED(name)                       \
  ::trainwatch::internal::AssignAll(in.name(), &out->name, \
                                    [](const auto& v, auto* o) { FromWire(v, o); });
#define TW_FROM_WIRE_MAP(name) \
  out->name.clear();           \
  for (const auto& [key, value] : in.name()) FromWire(value, &out->name[key]);
#define TW_FROM_WIRE_WRAPPED(name, inner) \
  out->name.clear();                      \
  for (const auto& value : in.name().inner()) FromWire(value, &out->name.emplace_back());
#define TW_FROM_WIRE                                                           \
  TW_FROM_WIRE_VALUE, TW_FROM_WIRE_OPTIONAL, TW_FROM_WIRE_MESSAGE,             \
      TW_FROM_WIRE_REPEATED, TW_FROM_WIRE_MAP, TW_FROM_WIRE_WRAPPED

#endif  // TRAINWATCH_CLIENT_SRC_FIELD_CONVERT_H_
