// The one table of a step record's fields, from which the C++ client's
// conversion (Step -> v1::StepRecord), the JSON writer of trainwatchctl and
// the Python binding's argument list come. A field added to StepRecord is
// added here, in proto order, and to Step; everything that lists fields
// follows. The fields that need their own code (step, grad_norm, the
// derived clipped and clip_coef, skipped, time, batch_ids, layer_stats) are
// named at the end, so a reader sees the whole record here.
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

// The rest, for the record (each has its own conversion): step (uint64),
// grad_norm (double, always present), clipped (optional bool, derived),
// skipped (bool), time_unix_nanos (int64), batch_ids (repeated int64),
// layer_stats (map of LayerStats).

#endif  // TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_STEP_FIELDS_H_
