// The parser of MoeLayerStats.tokens_per_expert, the packed field that is
// most of an MoE report's bytes (48 x 128 counts a record, ~3-byte varints).
//
// The generated code's call to protobuf's PackedUInt64Parser for that one
// field is replaced by this one when the code is generated
// (patch_counts_parser.cmake): protobuf's grows the repeated field as it
// goes (128 counts grow it six times) and takes a function call for every
// varint over two bytes; this one counts the varints first, reserves them
// once and decodes each with a few word operations. It accepts and rejects
// exactly what protobuf's does, with the same values (packed_counts_test
// compares the two on random bytes), and leaves to protobuf's any field
// that does not lie whole in the parser's current buffer.
#pragma once

#include <cstdint>

#include "google/protobuf/parse_context.h"
#include "google/protobuf/repeated_field.h"

namespace trainwatch::v1::wire {

// Parses a length-delimited packed uint64 field whose tag has been read:
// appends its values to `out` and returns the pointer past it, or nullptr
// on a malformed field (a varint over 10 bytes, or one the length cuts).
const char* ParsePackedCounts(google::protobuf::RepeatedField<uint64_t>* out,
                              const char* ptr,
                              google::protobuf::internal::ParseContext* ctx);
}  // namespace trainwatch::v1::wire
