// The one table of a step record's fields, from which the C++ client's
// conversions (Step <-> v1::StepRecord, both ways), the JSON writer of
// trainwatchctl and the Python binding's checks of its argument lists come.
// A field added to StepRecord is added here and to Step (same name);
// everything that lists fields follows, and client_fields_test, which fills
// every field of the proto by reflection, fails until it is.
//
// Each table names its fields by shape, one macro argument per shape:
//   VALUE(name)            a plain value: T <-> a proto3 scalar, string or
//                          enum (an enum class of the same values)
//   OPTIONAL(name)         std::optional<T> <-> a proto3 `optional` scalar
//   MESSAGE(name)          std::optional<S> <-> a message field
//   REPEATED(name)         std::vector<T> <-> a repeated scalar, or a
//                          repeated message (T then has its own ToWire)
//   MAP(name)              std::map<std::string, S> <-> a map
//   WRAPPED(name, inner)   std::vector<S> <-> a message whose one field is
//                          `repeated inner`
// (client/src/field_convert.h spells out each shape's conversion.)
#ifndef TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_STEP_FIELDS_H_
#define TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_STEP_FIELDS_H_

// X(name): the optional floats a record may carry and a JSON line names
// by the same snake_case name; in Step a std::optional<double> each, in the
// proto an `optional double`. clip_coef is among them (it is derived from
// max_norm when absent, by DeriveClipping after FillStepRecord).
#define TRAINWATCH_STEP_OPTIONAL_DOUBLES(X) \
  X(clip_coef)                              \
  X(loss_scale)                             \
  X(max_attn_logit)                         \
  X(log_z)                                  \
  X(loss)                                   \
  X(lr)                                     \
  X(shard_sq_sum)                           \
  X(step_time_s)                            \
  X(data_wait_s)

// StepRecord <-> Step. time_unix_nanos 0 is "now" to the client, and an
// absent clipped and clip_coef are derived from max_norm: what the client
// does with a field, after the conversion.
#define TRAINWATCH_STEP_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, MAP,  \
                               WRAPPED)                                 \
  VALUE(step)                                                           \
  VALUE(grad_norm)                                                      \
  OPTIONAL(clipped)                                                     \
  TRAINWATCH_STEP_OPTIONAL_DOUBLES(OPTIONAL)                            \
  OPTIONAL(tokens)                                                      \
  VALUE(skipped)                                                        \
  VALUE(time_unix_nanos)                                                \
  REPEATED(batch_ids)                                                   \
  MAP(layer_stats)                                                      \
  MAP(fp8)                                                              \
  WRAPPED(moe, layers)                                                  \
  OPTIONAL(rank)

// LayerStats <-> LayerStat.
#define TRAINWATCH_LAYER_STAT_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, \
                                     MAP, WRAPPED)                      \
  VALUE(grad_norm)                                                      \
  VALUE(grad_rms)                                                       \
  VALUE(g_over_sqrt_v_rms)                                              \
  OPTIONAL(update_rms_ratio)                                            \
  VALUE(kind)

// Fp8TensorStats <-> Fp8Stat.
#define TRAINWATCH_FP8_STAT_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, MAP, \
                                   WRAPPED)                                \
  VALUE(format)                                                            \
  VALUE(amax)                                                              \
  VALUE(scale)                                                             \
  VALUE(amax_history_len)                                                  \
  VALUE(margin)                                                            \
  OPTIONAL(overflow_fraction)                                              \
  OPTIONAL(underflow_fraction)                                             \
  VALUE(amax_group)

// MoeLayerStats <-> MoeLayerStat.
#define TRAINWATCH_MOE_LAYER_STAT_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, \
                                         MAP, WRAPPED)                      \
  VALUE(layer)                                                              \
  REPEATED(tokens_per_expert)                                               \
  OPTIONAL(dropped)                                                         \
  OPTIONAL(aux_loss)                                                        \
  OPTIONAL(z_loss)                                                          \
  REPEATED(expert_bias)                                                     \
  OPTIONAL(router_logit_max)

// TRAINWATCH_FIELDS(TABLE, F): TABLE with one macro F(name, ...) for every
// shape (WRAPPED's inner name in the ...): a table's names, its length.
#define TRAINWATCH_FIELDS(TABLE, F) TABLE(F, F, F, F, F, F)

#endif  // TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_STEP_FIELDS_H_
