"""record()'s slow path: values that are not plain floats (numpy scalars,
CPU tensors, accelerator tensors copied to pinned host memory, layer, fp8
and MoE stats) as the binding's plain data."""

from ._fields import (_BOOL_FIELDS, _FIELDS, _FP8_KEYS, _LAYER_STAT_DEFAULTS,
                      _LAYER_STAT_KEYS, _MOE_CONFIG_KEYS, _MOE_KEYS, FP8_FORMATS,
                      MOE_BALANCING)

def _step_index(step):
    try:
        step = int(step.__index__()) if not isinstance(step, int) else step
    except AttributeError:
        raise TypeError(f"step must be an int, got {type(step).__name__}") from None
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return step


def _plain(name, v):
    if v is None:
        return name != "grad_norm"
    return isinstance(v, (int, float, list, tuple, dict))


def _is_ids(t, torch):
    return not (t.is_floating_point() or t.dtype == torch.bool)


def _host_value(name, value, torch, devices, pos, key=None):
    """Returns `value` as plain Python data. Accelerator tensors are left in
    place, noted in `devices` as ((pos, key), tensor), and later filled in by
    _fill_from_host."""
    if value is None or isinstance(value, float) or (
            isinstance(value, (int, bool)) and name != "batch_ids"):
        return value
    if torch is not None and isinstance(value, torch.Tensor):
        # Cheap attributes only: .device builds an object (~0.4 us).
        if value.is_cuda:
            devices.append(((pos, key), value))
            return None
        if not value.is_cpu:  # e.g. xla, mps: no async copy here (syncs)
            value = value.detach().cpu()
        if name == "batch_ids":
            return [int(x) for x in value.reshape(-1).tolist()]
        if name == "layer_stats" and key is not None:
            return tuple(float(x) for x in value.reshape(-1).tolist())
        try:
            v = value.item()  # CPU tensor: reads memory, no sync
        except (ValueError, RuntimeError):
            raise ValueError(f"record(): {name} must have one element, "
                             f"got shape {tuple(value.shape)}") from None
        return bool(v) if name in _BOOL_FIELDS else float(v)
    if name == "batch_ids":
        if hasattr(value, "tolist"):  # numpy array
            value = value.tolist()
        if isinstance(value, int):
            value = [value]
        out = []
        for x in value:
            if torch is not None and isinstance(x, torch.Tensor):
                x = x.item() if x.device.type == "cpu" else x.cpu().item()
            out.append(int(x))
        return out
    if name == "layer_stats":
        if not isinstance(value, dict):
            raise TypeError("record(): layer_stats must be a dict of layer name -> stats")
        out = {}
        for layer, stat in value.items():
            if isinstance(stat, dict):
                stat = tuple(stat.get(k, d) for k, d in zip(_LAYER_STAT_KEYS, _LAYER_STAT_DEFAULTS))
            if torch is not None and isinstance(stat, torch.Tensor):
                if stat.numel() not in (3, 4):
                    raise ValueError(f"record(): layer_stats[{layer!r}] must have 3 or 4 elements")
                out[str(layer)] = _host_value(name, stat, torch, devices, pos, str(layer))
                continue
            if len(stat) not in (3, 4):
                raise ValueError(f"record(): layer_stats[{layer!r}] must be (grad_norm, "
                                 "grad_rms, g_over_sqrt_v_rms[, update_rms_ratio])")
            out[str(layer)] = tuple(
                _host_value("layer_stat", s, torch, devices, pos, (str(layer), j))
                for j, s in enumerate(stat))
        return out
    if name == "fp8":
        return _fp8_entries(value)
    if name == "moe":
        return _moe_entries(value, torch, devices, pos)
    if name in _BOOL_FIELDS:
        try:
            return bool(value)  # numpy.bool_
        except Exception:
            raise TypeError(f"record(): {name} must be a bool, got {type(value).__name__}") from None
    try:
        return float(value)  # numpy scalars, Decimal, ...
    except (TypeError, ValueError):
        raise TypeError(f"record(): {name} must be a number, got {type(value).__name__}") from None


def _fp8_entries(value):
    """record(fp8=...) as the binding's tuples (see Fp8StatEntry in binding.cc)."""
    if not isinstance(value, dict):
        raise TypeError("record(): fp8 must be a dict of tensor name -> stats dict")
    out = {}
    for tensor, stat in value.items():
        if not isinstance(stat, dict):
            raise TypeError(f"record(): fp8[{tensor!r}] must be a dict with keys {_FP8_KEYS}")
        unknown = set(stat) - set(_FP8_KEYS)
        if unknown:
            raise ValueError(f"record(): fp8[{tensor!r}] has unknown keys {sorted(unknown)}")
        fmt = stat.get("format")
        code = FP8_FORMATS.get(fmt.upper()) if isinstance(fmt, str) else fmt
        if code not in FP8_FORMATS.values():
            raise ValueError(f"record(): fp8[{tensor!r}].format must be one of "
                             f"{sorted(FP8_FORMATS)}, got {fmt!r}")
        try:
            nums = [float(stat.get(k, 0.0)) for k in ("amax", "scale", "margin")]
            hist = int(stat.get("amax_history_len", 0))
            fracs = [None if stat.get(k) is None else float(stat[k])
                     for k in ("overflow_fraction", "underflow_fraction")]
        except (TypeError, ValueError) as e:
            raise TypeError(f"record(): fp8[{tensor!r}]: {e}") from None
        if hist < 0:
            raise ValueError(f"record(): fp8[{tensor!r}].amax_history_len must be >= 0")
        group = stat.get("amax_group", "")
        if not isinstance(group, str):
            raise TypeError(f"record(): fp8[{tensor!r}].amax_group must be a str")
        out[str(tensor)] = (code, nums[0], nums[1], hist, nums[2], fracs[0], fracs[1], group)
    return out


def _baseline_refs(baselines):
    """Client(baselines=...) as the binding's (run, attempt) pairs: each
    entry "run", "run@attempt" or a (run, attempt) pair."""
    if baselines is None:
        return []
    if isinstance(baselines, (str, tuple)):
        baselines = [baselines]
    out = []
    for ref in baselines:
        if isinstance(ref, str):
            run, at, attempt = ref.rpartition("@") if "@" in ref else (ref, "", "0")
            if not run or not attempt.isdigit():
                raise ValueError(f"baselines: {ref!r} is not 'run' or 'run@attempt'")
            ref = (run, int(attempt))
        if (not isinstance(ref, tuple) or len(ref) != 2 or not isinstance(ref[0], str)
                or not ref[0] or isinstance(ref[1], bool) or not isinstance(ref[1], int)
                or ref[1] < 0):
            raise ValueError(f"baselines: {ref!r} is not 'run@attempt' or (run, attempt)")
        out.append(ref)
    return out


def _moe_config(moe):
    """Client(moe=...) as the binding's tuple, or None."""
    if moe is None:
        return None
    if not isinstance(moe, dict):
        raise ValueError(f"moe must be a dict with keys {_MOE_CONFIG_KEYS}")
    unknown = set(moe) - set(_MOE_CONFIG_KEYS)
    if unknown:
        raise ValueError(f"moe has unknown keys {sorted(unknown)}")
    balancing = moe.get("balancing", "UNSPECIFIED")
    code = MOE_BALANCING.get(str(balancing).upper())
    if code is None:
        raise ValueError(f"moe balancing must be one of {sorted(MOE_BALANCING)}, got {balancing!r}")
    ints = []
    for k in ("num_experts", "top_k", "ep_size"):
        v = moe.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"moe {k} must be a non-negative int, got {v!r}")
        ints.append(v)
    try:
        floats = [float(moe.get(k, 0.0)) for k in ("aux_loss_coeff", "z_loss_coeff",
                                                   "bias_update_rate", "capacity_factor")]
    except (TypeError, ValueError) as e:
        raise ValueError(f"moe: {e}") from None
    return (*ints, code, *floats)


def _moe_entries(value, torch, devices, pos):
    """record(moe=...) as the binding's tuples (see MoeEntries in binding.cc);
    CUDA tensors are noted in `devices` with key ("moe", layer index, field)."""
    if isinstance(value, dict) and "tokens_per_expert" not in value:
        value = [dict(stat, layer=str(layer)) for layer, stat in value.items()]
    elif isinstance(value, dict):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError("record(): moe must be a list of layer dicts (or a dict of layer -> dict)")
    out = []
    for i, stat in enumerate(value):
        if not isinstance(stat, dict):
            raise TypeError(f"record(): moe[{i}] must be a dict with keys {_MOE_KEYS}")
        unknown = set(stat) - set(_MOE_KEYS)
        if unknown:
            raise ValueError(f"record(): moe[{i}] has unknown keys {sorted(unknown)}")
        entry = [str(stat.get("layer", i))]
        for j, key in enumerate(_MOE_KEYS[1:], start=1):
            v = stat.get(key)
            if key in ("tokens_per_expert", "expert_bias"):
                if v is None:
                    entry.append([])
                elif torch is not None and isinstance(v, torch.Tensor):
                    if v.is_cuda:
                        devices.append(((pos, ("moe", i, j)), v.reshape(-1)))
                        entry.append([])
                    else:
                        v = v.detach().cpu().reshape(-1).tolist()
                        entry.append([int(x) for x in v] if j == 1 else [float(x) for x in v])
                else:
                    try:
                        entry.append([int(x) for x in v] if j == 1 else [float(x) for x in v])
                    except (TypeError, ValueError):
                        raise TypeError(f"record(): moe[{i}].{key} must be a list of numbers") from None
                    if j == 1 and any(x < 0 for x in entry[-1]):
                        raise ValueError(f"record(): moe[{i}].tokens_per_expert must be >= 0")
            elif v is None:
                entry.append(None)
            elif torch is not None and isinstance(v, torch.Tensor) and v.is_cuda:
                devices.append(((pos, ("moe", i, j)), v.reshape(-1)[:1]))
                entry.append(None)
            else:
                try:
                    entry.append(int(v) if key == "dropped" else float(v))
                except (TypeError, ValueError):
                    raise TypeError(f"record(): moe[{i}].{key} must be a number") from None
        out.append(tuple(entry))
    return out


def _fill_from_host(values, buffers):
    """Puts the copied values (now in pinned host memory) into `values`."""
    host_f, host_i, layout = buffers
    fl = host_f.tolist() if host_f is not None else []
    il = host_i.tolist() if host_i is not None else []
    fi = ii = 0
    for pos, key, is_ids, n in layout:
        if is_ids:
            chunk, ii = il[ii:ii + n], ii + n
        else:
            chunk, fi = fl[fi:fi + n], fi + n
        name = _FIELDS[pos]
        if key is None:  # a whole field
            if name == "batch_ids":
                values[pos] = [int(x) for x in chunk]
            elif name in _BOOL_FIELDS:
                values[pos] = bool(chunk[0])
            else:
                values[pos] = float(chunk[0])
        elif isinstance(key, str):  # a layer's 3-element tensor
            values[pos][key] = tuple(float(x) for x in chunk)
        elif len(key) == 3:  # an MoE layer's field (counts, bias or a scalar)
            _, i, j = key
            entry = list(values[pos][i])
            if j in (1, 5):
                entry[j] = [int(x) for x in chunk] if j == 1 else [float(x) for x in chunk]
            else:
                entry[j] = int(chunk[0]) if j == 2 else float(chunk[0])
            values[pos][i] = tuple(entry)
        else:  # one element of a layer's tuple
            layer, j = key
            stat = list(values[pos][layer])
            stat[j] = float(chunk[0])
            values[pos][layer] = tuple(stat)
