// What clip_grad_norm_ does with a pre-clip norm, defined once for the client
// (a record's derived clipped and clip_coef), the server (a record without
// them), the chunk codec (its clip_coef prediction) and the report;
// trainwatch.torch.clip_fields is the same arithmetic on tensors, and its
// tests check it against these at the boundary.
#ifndef TRAINWATCH_PROTO_TRAINWATCH_V1_CLIPPING_H_
#define TRAINWATCH_PROTO_TRAINWATCH_V1_CLIPPING_H_

#include <algorithm>

namespace trainwatch::v1 {

// clip_grad_norm_ divides by (norm + 1e-6) so a zero norm does not divide
// by 0.
inline constexpr double kClipEpsilon = 1e-6;

// The coefficient the gradients are multiplied by: min(1, max_norm /
// (norm + 1e-6)); 0 for a +Inf norm, 1 for a NaN one (std::min keeps its
// first argument when the comparison is false, as Python's min does).
inline double ClipCoef(double max_norm, double grad_norm) {
  return std::min(1.0, max_norm / (grad_norm + kClipEpsilon));
}

// The coefficient as trainwatch.torch's clip_fields computes it on a float32
// norm tensor (clip_grad_norm_ on float32 grads): torch's max_norm / t is
// t.reciprocal() * max_norm, each op rounded to float32, then clamp(max=1),
// which keeps a NaN. Widened to double, as tensor.item() gives it. The
// chunk codec predicts a record's clip_coef with it when ClipCoef does not
// give the chunk's coefficients.
inline double ClipCoefFloat32(double max_norm, double grad_norm) {
  const float r = 1.0f / (static_cast<float>(grad_norm) + static_cast<float>(kClipEpsilon));
  const float c = r * static_cast<float>(max_norm);
  return static_cast<double>(c > 1.0f ? 1.0f : c);
}

// Clipped: clipping is on (max_norm > 0) and the coefficient scales the
// gradients down (< 1), which is what clip_grad_norm_ applies; a norm within
// 1e-6 under max_norm is clipped (by less than a part in 10^6), a +Inf one
// is, a NaN one is not.
inline bool ClippedAt(double max_norm, double grad_norm) {
  return max_norm > 0 && ClipCoef(max_norm, grad_norm) < 1.0;
}

}  // namespace trainwatch::v1

#endif  // TRAINWATCH_PROTO_TRAINWATCH_V1_CLIPPING_H_
