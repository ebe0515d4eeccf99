"""The client's field tables: the names record() and Client() take, in the
binding's order, the enums a user passes by name, and the import-time check
that each table takes every field of the C++ client's (step_fields.h,
run_start_fields.h): a field added there and not here fails the import
instead of being silently lost."""

from . import _trainwatch

# The enums a user passes by name (the rest is the client's).
__all__ = ["EVENT_KINDS", "DIRECTIVE_STATES", "LAYER_KINDS", "FP8_FORMATS", "MOE_BALANCING"]



def _enum(name, lower=False, unspecified=None):
    """The proto enum `name`'s values by name, from the binding's
    descriptors (_trainwatch.ENUMS): its *_UNSPECIFIED value left out, or
    kept as `unspecified`; names lowercased where users write them so."""
    out = {}
    for value, number in _trainwatch.ENUMS[name].items():
        if number == 0:
            if unspecified is not None:
                out[unspecified] = 0
            continue
        out[value.lower() if lower else value] = number
    return out


# RunEvent kinds (docs/contracts.md), as the C++ EventKind values.
EVENT_KINDS = _enum("EventKind", lower=True)
# A rank's answers to a closed-loop directive (docs/closed-loop.md), as the
# C++ DirectiveState values.
DIRECTIVE_STATES = _enum("DirectiveState", lower=True)

# StepRecord fields record() takes after step, in the binding's order.
_FIELDS = ("grad_norm", "loss", "loss_scale", "skipped", "clipped", "clip_coef",
           "max_attn_logit", "log_z", "lr", "step_time_s", "data_wait_s",
           "tokens", "rank", "batch_ids", "shard_sq_sum", "layer_stats", "fp8", "moe")


def _check_fields(table, taken, where):
    """Raises ImportError for a field of the C++ client's field table
    `table` (step_fields.h, run_start_fields.h) that `taken` lacks: a field
    added there and not here would be silently lost."""
    missing = set(getattr(_trainwatch, table)) - set(taken)
    if missing:
        raise ImportError(f"trainwatch: {where} does not take {sorted(missing)}, "
                          f"which the C++ client's field table {table} has")


# record() stamps time_unix_nanos itself.
_check_fields("STEP_FIELDS", ("step", "time_unix_nanos") + _FIELDS, "record()")
_BOOL_FIELDS = frozenset(("skipped", "clipped"))
_BOOL_POSITIONS = frozenset(_FIELDS.index(f) for f in _BOOL_FIELDS)
_LAST_SCALAR = _FIELDS.index("batch_ids")  # fields before it are scalars


# LayerKind values (docs/contracts.md LayerStats.kind), by name.
LAYER_KINDS = _enum("LayerKind")


# A layer_stats entry's values, in the binding's order, and their defaults
# in a dict; the kind comes from set_layer_kinds().
_LAYER_STAT_KEYS = ("grad_norm", "grad_rms", "g_over_sqrt_v_rms", "update_rms_ratio")
_LAYER_STAT_DEFAULTS = (0.0, 0.0, float("nan"), None)
_check_fields("LAYER_STAT_FIELDS", _LAYER_STAT_KEYS + ("kind",), "record(layer_stats=...)")


# Fp8Format values (docs/contracts.md fp8), by the names a user passes.
FP8_FORMATS = _enum("Fp8Format")
_FP8_KEYS = ("format", "amax", "scale", "amax_history_len", "margin",
             "overflow_fraction", "underflow_fraction", "amax_group")
_check_fields("FP8_STAT_FIELDS", _FP8_KEYS, "record(fp8=...)")


# MoeBalancing values (docs/contracts.md RunStart.moe), by the names a user passes.
MOE_BALANCING = _enum("MoeBalancing", unspecified="UNSPECIFIED")
_MOE_CONFIG_KEYS = ("num_experts", "top_k", "ep_size", "balancing", "aux_loss_coeff",
                    "z_loss_coeff", "bias_update_rate", "capacity_factor")
_MOE_KEYS = ("layer", "tokens_per_expert", "dropped", "aux_loss", "z_loss", "expert_bias",
             "router_logit_max")
_check_fields("MOE_CONFIG_FIELDS", _MOE_CONFIG_KEYS, "Client(moe=...)")
_check_fields("MOE_LAYER_STAT_FIELDS", _MOE_KEYS, "record(moe=...)")
