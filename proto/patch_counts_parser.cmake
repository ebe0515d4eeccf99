# Run after protoc (cmake -P, PB_CC set): the generated parser of
# MoeLayerStats.tokens_per_expert calls trainwatch's (packed_counts.h)
# instead of protobuf's PackedUInt64Parser. Where protoc's output has not
# the expected call (another protobuf), the code is left as generated, with
# a warning: protobuf's parser is as correct, only slower, and
# packed_counts_test fails on its capacity check.
file(READ "${PB_CC}" src)
set(call "::PROTOBUF_NAMESPACE_ID::internal::PackedUInt64Parser(_internal_mutable_tokens_per_expert(), ptr, ctx)")
set(ours "::trainwatch::v1::wire::ParsePackedCounts(_internal_mutable_tokens_per_expert(), ptr, ctx)")
set(marker "// @@protoc_insertion_point(includes)")
string(FIND "${src}" "${call}" at_call)
string(FIND "${src}" "${marker}" at_marker)
if(at_call EQUAL -1 OR at_marker EQUAL -1)
  message(WARNING "${PB_CC}: no call to PackedUInt64Parser for tokens_per_expert "
                  "or no includes insertion point; the counts keep protobuf's parser")
  return()
endif()
string(REPLACE "${call}" "${ours}" src "${src}")
string(REPLACE "${marker}" "#include \"trainwatch/v1/packed_counts.h\"\n${marker}" src "${src}")
file(WRITE "${PB_CC}" "${src}")
