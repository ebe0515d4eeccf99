// The encoding of a chunk of step records (one `step_chunks.records` blob).
//
// Columnar within a chunk, each column coded by what it usually looks like:
// steps and times as delta or delta-of-delta, each double field as a presence
// bitmap plus the residual of the best of three predictors (XOR with the
// previous value, as Gorilla and Prometheus do, or the difference / second
// difference of the values as ordered integers), flags as bitmaps or runs,
// batch ids as deltas. Residuals are written with an Exp-Golomb code whose
// parameter is chosen per column and chunk, after dropping the trailing zero
// bits every residual shares (a float32 value widened to double leaves 29).
// Every value reads back bit for bit: NaN payloads, -0.0 and infinities.
//
// What the columns do not cover (layer_stats, unknown fields, and any field
// added to StepRecord later) is kept per record as a serialized StepRecord of
// those fields alone: a new proto field is stored without a codec change.
// The MoE routing counts (moe.layers[].tokens_per_expert, ~6k a record in a
// large MoE) are the exception: taken out of the residue, they are coded
// against the same layer's counts in the chunk's earlier records
// (moe_counts.h), ~2 bytes a count instead of protobuf's 3.
//
// The blob starts with a format byte whose low three bits are 7, which no
// protobuf tag has (wire type 7 does not exist), so a chunk written before
// this encoding (a serialized StepBatch) is told apart by its first byte;
// DecodeStepChunk reads both. The byte layout is in docs/architecture.md.
//
// The codec's layers, each on the one below: bits.h (the bit writer and
// reader), golomb.h (Exp-Golomb and zigzag codes), series.h and bitmap.h
// (a column's values and flags), moe_counts.h (the MoE counts), and
// step_codec.cc (a chunk's columns).
//
// Thread-safe: pure functions.
#ifndef TRAINWATCH_SERVER_STORE_CODEC_STEP_CODEC_H_
#define TRAINWATCH_SERVER_STORE_CODEC_STEP_CODEC_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// The first byte of a columnar chunk: format version 1, and version 2, which
// adds the MoE counts after the residues (moe_counts.h) and is written only
// for a chunk that has some. The encoder sets kStepChunkFloat32 in either
// (0x17, 0x1f): a clip_coef column with an implied max_norm then says which
// formula predicts it, clip_grad_norm_'s in double (ClipCoef) or in float32
// (ClipCoefFloat32, trainwatch.torch's tensor path). A chunk without the flag
// (written by schema version 11 or older) has the double one.
inline constexpr unsigned char kStepChunkColumnarV1 = 0x07;
inline constexpr unsigned char kStepChunkColumnarV2 = 0x0f;
inline constexpr unsigned char kStepChunkFloat32 = 0x10;

// Encodes `records` in order (the writer passes only the ones it stores).
std::string EncodeStepChunk(
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records);
// The records at `indices` of `records`, in that order. `moe_counts`, when
// given, is EncodeMoeCounts(records): used when the indices are all of
// them in order (a batch of records none of which was stored before).
std::string EncodeStepChunk(
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records,
    absl::Span<const size_t> indices, std::string_view moe_counts = {});

// The MoE counts' part of the chunk of all `records` (empty when none has
// counts): the bytes EncodeStepChunk ends with. Ingest codes them ahead, on
// the thread that parsed them while they are still in its cache; the
// writer's first pass over them waited on memory.
std::string EncodeMoeCounts(const google::protobuf::RepeatedPtrField<v1::StepRecord>& records);

// Appends `v` as a base-128 varint, as protobuf writes one (the count at
// the head of a chunk, and rank_digest.h's rank_tail rows).
void PutVarint(std::string& out, uint64_t v);

// Decodes a chunk of either format into `out` (cleared first). DATA_LOSS
// with what was being read and where, for a blob that is corrupt or cut
// short; never reads out of bounds.
absl::Status DecodeStepChunk(
    std::string_view blob,
    google::protobuf::RepeatedPtrField<v1::StepRecord>* out);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_CODEC_STEP_CODEC_H_
