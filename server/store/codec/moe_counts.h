// The MoE routing counts of a step chunk (step_codec.h): every
// tokens_per_expert of the chunk's MoE reports, coded against the same
// layer's counts earlier in the chunk.
//
// A 48-layer x 128-expert report is ~6k counts a record, each near
// T x k / E and moving by its noise from one step to the next, so a count
// is coded as its difference from a prediction: the same layer's counts in
// the previous record that has that layer (same name, same number of
// experts), their moving average over such records (each new one weighing
// 1/4), or, for the layer's first record in the chunk, the layer's own
// mean, stored. The writer prices each (layer, record) under each
// prediction and keeps the cheapest with its own Exp-Golomb k.
//
// Bits, in order: the number of counts of every layer of the reports (a
// series), then for each layer with counts, the prediction (2 bits), for the
// own mean its bit width (7 bits) and bits, a bit for zero flags, k (6 bits)
// and one zigzagged Exp-Golomb code per count.
//
// Thread-safe: pure functions.
#ifndef TRAINWATCH_SERVER_STORE_CODEC_MOE_COUNTS_H_
#define TRAINWATCH_SERVER_STORE_CODEC_MOE_COUNTS_H_

#include "absl/types/span.h"
#include "store/codec/bits.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::codec {

// True when some layer of `report` has counts.
bool HasMoeCounts(const v1::MoeStats& report);

// Writes the counts of every layer of `reports`, in order.
void PutMoeCounts(BitWriter& w, absl::Span<const v1::MoeStats* const> reports);

// Sets tokens_per_expert of every layer of `reports` (which hold none), in
// the order PutMoeCounts wrote them. False when the reader failed or the
// bits are not such counts; never allocates more than the bits left imply
// (a count costs at least a bit).
bool GetMoeCounts(BitReader& r, absl::Span<v1::MoeStats* const> reports);

}  // namespace trainwatch::codec

#endif  // TRAINWATCH_SERVER_STORE_CODEC_MOE_COUNTS_H_
