// A message's bytes in deterministic serialization (map entries sorted), so
// that two messages compare equal bit for bit, NaN payloads and -0.0
// included, whatever order their maps were filled in.
#ifndef TRAINWATCH_TESTS_COMMON_PROTO_BYTES_H_
#define TRAINWATCH_TESTS_COMMON_PROTO_BYTES_H_

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message_lite.h"

namespace trainwatch::testing {

inline std::string DeterministicBytes(const google::protobuf::MessageLite& m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_COMMON_PROTO_BYTES_H_
