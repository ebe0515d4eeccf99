// The one table of RunStart's fields as ClientOptions holds them (same
// names), from which MakeRunStart and ApplyRunStart (run_start.h) and the
// Python binding's checks of Client()'s arguments come. A field added to
// RunStart is added here and to ClientOptions; client_fields_test, which fills
// every field of the proto by reflection, fails until it is. The shapes are
// step_fields.h's.
#ifndef TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_RUN_START_FIELDS_H_
#define TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_RUN_START_FIELDS_H_

#include "trainwatch/step_fields.h"

// RunStart <-> ClientOptions. world_size 0 is read as 1 (the wire's rule,
// and the client's rank < world_size check), after the conversion.
#define TRAINWATCH_RUN_START_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, MAP, \
                                    WRAPPED)                                \
  VALUE(run_id)                                                             \
  VALUE(rank)                                                               \
  VALUE(world_size)                                                         \
  VALUE(attempt)                                                            \
  VALUE(precision)                                                          \
  VALUE(max_norm)                                                           \
  VALUE(warmup_steps)                                                       \
  VALUE(scaler_growth_interval)                                             \
  OPTIONAL(adam_eps)                                                        \
  OPTIONAL(adam_beta2)                                                      \
  MAP(labels)                                                               \
  VALUE(host)                                                               \
  MESSAGE(moe)                                                              \
  VALUE(last_applied_directive)                                             \
  REPEATED(baselines)                                                       \
  REPEATED(local_ranks)

// MoeConfig (the proto's) <-> MoeConfig (the client's).
#define TRAINWATCH_MOE_CONFIG_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, MAP, \
                                     WRAPPED)                                \
  VALUE(num_experts)                                                         \
  VALUE(top_k)                                                               \
  VALUE(ep_size)                                                             \
  VALUE(balancing)                                                           \
  VALUE(aux_loss_coeff)                                                      \
  VALUE(z_loss_coeff)                                                        \
  VALUE(bias_update_rate)                                                    \
  VALUE(capacity_factor)

// BaselineRef (the proto's) <-> BaselineRef (the client's).
#define TRAINWATCH_BASELINE_REF_FIELDS(VALUE, OPTIONAL, MESSAGE, REPEATED, \
                                       MAP, WRAPPED)                      \
  VALUE(run)                                                              \
  VALUE(attempt)

#endif  // TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_RUN_START_FIELDS_H_
