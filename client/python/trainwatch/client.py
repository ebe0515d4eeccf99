"""trainwatch.Client: the binding of the C++ client (see the package's
docstring); its field tables are in _fields.py, its slow-path conversions in
_convert.py."""

import atexit
import os
import sys
import time
import weakref
from typing import NamedTuple

from . import _trainwatch
from ._convert import _baseline_refs, _fill_from_host, _host_value, _is_ids, _moe_config, _plain, _step_index
from ._fields import (_BOOL_POSITIONS, _FIELDS, _LAST_SCALAR, _check_fields, DIRECTIVE_STATES,
                      EVENT_KINDS, LAYER_KINDS)

__all__ = ["Client", "Stats"]

_RECORDED = _trainwatch.RECORDED
_DEFERRED = _trainwatch.DEFERRED

# Steps waiting for their device-to-host copies, at most. Past it the oldest
# is dropped (and counted), never waited for: a GPU this far behind the host
# is a loop with no sync at all, and record() must not become one.
_MAX_PENDING = 1024


class Stats(NamedTuple):
    """Counters of one Client (see ClientStats in client.h)."""
    recorded: int    # steps accepted into the C++ queue
    sent: int        # steps written to a stream (a resend counts again)
    acked: int       # steps the server acknowledged as durable
    dropped: int     # steps dropped: buffer full, or pending list overflow
    reconnects: int
    pending: int     # steps still waiting for a CUDA copy
    rejected: int = 0  # steps refused alone: a step >= 2^63, or by the server


_open_clients = weakref.WeakSet()


@atexit.register
def _close_open_clients():
    # Close before interpreter teardown rather than in a destructor run
    # while modules are being torn down.
    for client in list(_open_clients):
        try:
            client.close(timeout=2.0)
        except Exception:  # nothing to report to at exit
            pass


class Client:
    """One trainer process's (rank's) stream to a trainwatch server.

    address: "host:port" of trainwatch-server's gRPC listener.
    run: run id, 1..128 chars of [A-Za-z0-9._:/-].
    rank, world_size, attempt: this process's rank, the job's size, and the
        restart count (a restart from a checkpoint is a new attempt).
    precision: "fp32", "bf16" or "fp16".
    max_norm: the clip threshold (0: clipping not configured). Records
        without clipped/clip_coef get them derived from it.
    warmup_steps: LR warmup length; windows start after it.
    labels: dict of str -> str (model, owner, cluster ...).
    adam_eps, adam_beta2: the optimizer's, for the layer-stat detectors.
    capacity: records held in memory (queued + unacknowledged) before
        record() drops.
    scaler_growth_interval: FP16 scaler growth interval (0: the server's
        default, 2000).
    auth_token: bearer token for a server started with --auth-token-file
        (default: $TRAINWATCH_TOKEN, if set).
    tls: connect with TLS, trusting the system's root CAs. Also on when any
        tls_* file is given.
    tls_ca_file: PEM root certificates the server's certificate must chain to.
    tls_cert_file, tls_key_file: PEM client certificate and key, for a server
        that requires them (--tls-client-ca).
    host: the machine this rank runs on, named by straggler and lemon-host
        alerts (default: this machine's hostname).
    last_applied_directive: the seq of the last closed-loop directive this
        lineage applied, restored from the checkpoint (docs/closed-loop.md);
        the server sends none at or below it. 0: none.
    baselines: the reference runs this run is compared with
        (BaselineDeviation, docs/baselines.md): "run" or "run@attempt"
        strings, or (run, attempt) pairs. Default: the previous attempt of
        this run, or what `trainwatchctl baseline set` names.
    local_ranks: a host stream (docs/contracts.md): the ranks whose records
        this client sends (a host's, `rank` among them), each record() then
        naming its rank; trainwatch.torch.HostGather gathers them. Default:
        this client sends its own rank's records.

    Raises ValueError for invalid arguments and FileNotFoundError for a TLS
    file that cannot be read. Does not wait for the server: an unreachable
    one is retried in the background while records buffer. A server that
    refuses the stream (a bad token, or one that may not write this run) is
    logged once on stderr and shown by `refusal`; flush() then raises
    PermissionError, and record() keeps returning at once (dropping, and
    counting, once the buffer is full).
    """

    def __init__(self, address, run, rank=0, world_size=1, precision="bf16",
                 max_norm=0.0, warmup_steps=0, labels=None, attempt=0,
                 adam_eps=None, adam_beta2=None, capacity=100000,
                 scaler_growth_interval=0, auth_token=None, tls=False,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None,
                 host=None, moe=None, last_applied_directive=0, baselines=None,
                 local_ranks=None):
        # Every argument as given, for new_attempt() to pass again.
        self._args = {k: v for k, v in locals().items()
                      if k not in ("self", "attempt", "last_applied_directive")}
        if not isinstance(address, str) or not address:
            raise ValueError("address must be a non-empty 'host:port' string")
        if not isinstance(run, str):
            raise ValueError("run must be a string")
        if not isinstance(precision, str):
            raise ValueError('precision must be "fp32", "bf16" or "fp16"')
        labels = {} if labels is None else labels
        if not all(isinstance(k, str) and isinstance(v, str)
                   for k, v in labels.items()):
            raise ValueError("labels must map str to str")
        for name, value in (("rank", rank), ("world_size", world_size),
                            ("attempt", attempt), ("warmup_steps", warmup_steps),
                            ("capacity", capacity),
                            ("scaler_growth_interval", scaler_growth_interval),
                            ("last_applied_directive", last_applied_directive)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        try:
            max_norm = float(max_norm)
            adam_eps = None if adam_eps is None else float(adam_eps)
            adam_beta2 = None if adam_beta2 is None else float(adam_beta2)
        except (TypeError, ValueError) as e:
            raise ValueError(f"max_norm, adam_eps and adam_beta2 must be numbers: {e}") from None
        if auth_token is None:
            auth_token = os.environ.get("TRAINWATCH_TOKEN", "").strip()
        files = {"tls_ca_file": tls_ca_file, "tls_cert_file": tls_cert_file,
                 "tls_key_file": tls_key_file}
        for name, value in files.items():
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"{name} must be a path, got {value!r}")
            files[name] = "" if value is None else os.fspath(value)
        if not isinstance(auth_token, str):
            raise ValueError("auth_token must be a string")
        if host is not None and not isinstance(host, str):
            raise ValueError("host must be a string")
        refs = _baseline_refs(baselines)
        local_ranks = [] if local_ranks is None else list(local_ranks)
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size
                   for r in local_ranks):
            raise ValueError(f"local_ranks must be ranks below world_size {world_size}, "
                             f"got {local_ranks!r}")
        if local_ranks and rank not in local_ranks:
            raise ValueError(f"local_ranks must list this client's rank {rank}: a host "
                             "stream is sent by one of its ranks")
        self._c = _trainwatch.Client(address, run, rank, world_size, attempt,
                                     precision, max_norm, warmup_steps,
                                     scaler_growth_interval, adam_eps, adam_beta2,
                                     labels, capacity, auth_token, bool(tls),
                                     files["tls_ca_file"], files["tls_cert_file"],
                                     files["tls_key_file"], host or "",
                                     _moe_config(moe), last_applied_directive, refs,
                                     local_ranks)
        self._record = self._c.fast_record()
        self.run = run
        self.rank = rank
        self.local_ranks = local_ranks
        self.world_size = world_size
        self.attempt = attempt
        self.last_applied_directive = last_applied_directive
        # FIFO of ("step", args, host_buffers, cuda_event) and
        # ("event", args) waiting for a device-to-host copy to finish.
        self._pending = []
        self._pending_dropped = 0
        self._closed = False
        self._last_step = None
        _open_clients.add(self)

    # -- the hot path ---------------------------------------------------------

    def record(self, step, grad_norm, loss=None, loss_scale=None, skipped=False,
               clipped=None, clip_coef=None, max_attn_logit=None, log_z=None,
               lr=None, batch_ids=None, shard_sq_sum=None, layer_stats=None,
               step_time_s=None, data_wait_s=None, fp8=None, moe=None, tokens=None, rank=None):
        """Records one optimizer step; never blocks.

        Every value may be a float/int/bool, a numpy scalar or a torch tensor
        (CPU or CUDA; one element, batch_ids any shape). grad_norm is the
        pre-clip global norm (what clip_grad_norm_ returns). batch_ids: ints
        (list, tuple, numpy array or tensor). layer_stats: dict of layer name
        to (grad_norm, grad_rms, g_over_sqrt_v_rms[, update_rms_ratio]), each
        entry a tuple, a dict with those keys, or a 3- or 4-element tensor.
        fp8: dict of FP8 tensor name to a dict {format ("E4M3", "E5M2",
        "E4M3_FNUZ", "E5M2_FNUZ"), amax, scale, amax_history_len, margin,
        overflow_fraction, underflow_fraction (optional), amax_group}
        (trainwatch.fp8 computes them; tensors in it are read with .item(),
        which syncs a GPU: send fp8 every N steps). step_time_s: seconds
        since the previous optimizer step (default: measured, the time since
        the previous record()); data_wait_s: the part of it spent waiting for
        the input pipeline (trainwatch.torch.StepHook measures it). moe: an
        MoE run's routing, a list of dicts (or a dict of layer name -> dict)
        {layer, tokens_per_expert (the routed assignments per expert in the
        global batch, a list or a tensor: trainwatch.torch.route_counts
        counts them on the device), dropped, aux_loss (without its
        coefficient, 1.0 = balanced), z_loss, expert_bias, router_logit_max},
        each optional but the counts; CUDA tensors are copied without a sync.
        tokens: tokens consumed so far (an int), the axis on which the run
        is compared with its baselines (StepHook fills it from
        tokens_per_step). rank: on a host stream (Client(local_ranks=...)),
        the rank this step is of, one of local_ranks; else None (this
        client's rank).

        Returns False when the step was dropped (buffer full, or the client
        is closed); True otherwise, including a step queued behind a CUDA copy.
        """
        if not self._pending:
            r = self._record(step, grad_norm, loss, loss_scale, skipped, clipped,
                             clip_coef, max_attn_logit, log_z, lr, step_time_s,
                             data_wait_s, tokens, rank, batch_ids, shard_sq_sum, layer_stats,
                             fp8, moe, 0)
            if r != _DEFERRED:
                if r == _RECORDED:
                    self._last_step = step
                return r == _RECORDED
        return self._record_slow(step, (grad_norm, loss, loss_scale, skipped,
                                        clipped, clip_coef, max_attn_logit,
                                        log_z, lr, step_time_s, data_wait_s, tokens,
                                        rank, batch_ids, shard_sq_sum, layer_stats, fp8, moe))

    # -- events, flush, close -------------------------------------------------

    def event(self, kind, step, detail=""):
        """Records a run event: "checkpoint_saved", "run_finished" or
        "run_failed". Ordered after every step recorded before it."""
        code = EVENT_KINDS.get(kind.lower() if isinstance(kind, str) else kind)
        if code is None:
            raise ValueError(f"event kind must be one of {sorted(EVENT_KINDS)}, got {kind!r}")
        step = _step_index(step)
        if not isinstance(detail, str):
            raise ValueError("detail must be a string")
        if self._closed:
            return False
        if self._pending:
            self._resolve(wait=False)
        if self._pending:
            self._pending.append(("event", (code, step, detail)))
            return True
        return self._c.event(code, step, detail)

    def flush(self, timeout=10.0):
        """Waits (up to timeout seconds) until everything recorded so far,
        pending CUDA copies included, is acknowledged by the server.
        Raises TimeoutError otherwise, or PermissionError at once when the
        server refuses the stream. Releases the GIL while waiting."""
        deadline = time.monotonic() + timeout
        self._resolve(wait=True)
        self._c.flush(max(0.0, deadline - time.monotonic()))

    def close(self, timeout=10.0):
        """Flushes (up to timeout seconds), then ends the stream. Idempotent.
        Returns True when everything was acknowledged; never raises for an
        unreachable server or a refusal (a trainer should not die at exit for
        that; see refusal)."""
        if self._closed:
            return True
        deadline = time.monotonic() + timeout
        try:
            self._resolve(wait=True)
        finally:
            self._closed = True
            _open_clients.discard(self)
            try:
                self._c.close(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, PermissionError, RuntimeError):
                return False
        return True

    @property
    def stats(self):
        """Stats(recorded, sent, acked, dropped, reconnects, pending, rejected)."""
        recorded, sent, acked, dropped, reconnects, rejected = self._c.stats()
        return Stats(recorded, sent, acked, dropped + self._pending_dropped,
                     reconnects, len(self._pending), rejected)

    # -- the closed loop (docs/closed-loop.md) --------------------------------

    def due_directives(self, step):
        """The directives received with apply_at_step <= step that this
        client has not answered, by seq; never blocks. Each is a dict as
        `trainwatchctl directives --json` shows it: id, seq, for_attempt,
        apply_at_step, alert, reason, approved_by, action ("checkpoint_now",
        "skip", "rollback", "scale_lr" or "stop") and, under the action's
        name, its fields ({"tag"}, {"batch_ids"}, {"to_step", "checkpoint",
        "skip_batch_ids", "lr_scale"}, {"factor"}, {"checkpoint_first"}).
        The client acks RECEIVED by itself. trainwatch.Control applies them;
        call this yourself only to wire another loop."""
        return self._c.due_directives(_step_index(step))

    def ack_directive(self, id, state, detail=""):
        """Answers a directive: "applied" once carried out (it is never due
        again), "rejected" with a detail ("late" when step > apply_at_step:
        the server reissues it for a later step). Sent in order with the
        records. False for an id this client has not received or has
        already answered applied."""
        code = DIRECTIVE_STATES.get(state.lower() if isinstance(state, str) else state)
        if code is None:
            raise ValueError(f"state must be one of {sorted(DIRECTIVE_STATES)}, got {state!r}")
        if not isinstance(detail, str):
            raise ValueError("detail must be a string")
        return self._c.ack_directive(str(id), code, detail)

    def new_attempt(self, last_applied_directive=None):
        """A new Client of the same run and options as attempt + 1 (a restart
        from a checkpoint, in process or not: steps of one attempt never go
        back). last_applied_directive: default this client's. Does not close
        this one."""
        if last_applied_directive is None:
            last_applied_directive = self.last_applied_directive
        return Client(attempt=self.attempt + 1,
                      last_applied_directive=last_applied_directive, **self._args)

    @property
    def refusal(self):
        """None, or why the server refuses this client's stream
        ("PERMISSION_DENIED: ..."), until it acknowledges data again."""
        return self._c.refusal()

    def set_layer_kinds(self, kinds):
        """Says what each layer that layer_stats names is: {name: kind}, kind
        one of "DENSE", "EMBEDDING", "OUTPUT", "NORM", "ROUTER" (docs/contracts.md
        LayerStats.kind), sent with each of its stats from now on. Without it
        the server infers the kind from the name. trainwatch.torch.StepHook
        calls it with the kinds of the model's modules."""
        codes = {}
        for name, kind in kinds.items():
            code = LAYER_KINDS.get(str(kind).upper())
            if code is None:
                raise ValueError(f"set_layer_kinds(): {name!r}: unknown kind {kind!r}; "
                                 f"one of {sorted(LAYER_KINDS)}")
            codes[str(name)] = code
        self._c.set_layer_kinds(codes)

    @property
    def recommended_max_norm(self):
        """The server's latest recommended clip threshold, or None."""
        return self._c.recommended_max_norm()

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # A loop that dies inside the block is a failed run; a normal exit
        # only closes (call event("run_finished", step) when training ends:
        # the block may also end for a restart).
        if exc_type is not None and not self._closed and self._last_step is not None:
            detail = f"{exc_type.__name__}: {exc}"[:1024]
            try:
                self.event("run_failed", self._last_step, detail)
            except Exception:
                pass
        self.close()
        return False

    def __repr__(self):
        return f"trainwatch.Client(run={self.run!r}, rank={self.rank}, closed={self._closed})"

    # -- everything off the fast path -----------------------------------------

    def _record_slow(self, step, values):
        if self._closed:
            return False
        step = _step_index(step)
        torch = sys.modules.get("torch")
        devices = []  # ((position, key), tensor) of values still on a GPU
        tensor = torch.Tensor if torch is not None else None
        converted = list(values)
        for i, value in enumerate(values):
            cls = value.__class__
            if value is None or cls is float or cls is bool:
                continue
            if cls is tensor and i < _LAST_SCALAR and value.is_cpu:
                # The common CPU-tensor case, inline: item() reads memory.
                try:
                    v = value.item()
                except (ValueError, RuntimeError):  # not one element
                    pass
                else:
                    converted[i] = bool(v) if i in _BOOL_POSITIONS else v
                    continue
            converted[i] = _host_value(_FIELDS[i], value, torch, devices, i)
        if self._pending:
            self._resolve(wait=False)
        if devices:
            self._queue_copy(step, converted, devices, time.time_ns())
            return True
        if self._pending:  # keep order behind earlier CUDA steps
            self._pending.append(("step", (step, converted, time.time_ns()), None, None))
            return True
        return self._submit(step, converted, 0)  # 0: stamped on the C++ side

    def _submit(self, step, values, stamp):
        r = self._record(step, *values, stamp)
        if r == _DEFERRED:
            bad = [f"{n}={v!r}" for n, v in zip(_FIELDS, values) if not _plain(n, v)]
            raise TypeError(f"record(): cannot read {', '.join(bad) or 'a field'} as plain numbers")
        if r == _RECORDED:
            self._last_step = step
        return r == _RECORDED

    def _queue_copy(self, step, values, devices, stamp):
        """Starts the device-to-host copies of `devices` and queues the step."""
        torch = sys.modules["torch"]
        with torch.no_grad():
            floats = [t for _, t in devices if not _is_ids(t, torch)]
            ids = [t for _, t in devices if _is_ids(t, torch)]
            host_f = host_i = None
            if floats:
                dev = floats[0].device
                flat = torch.cat([t.detach().reshape(-1).to(dev, torch.float64) for t in floats])
                host_f = torch.empty(flat.shape, dtype=torch.float64, pin_memory=True)
                host_f.copy_(flat, non_blocking=True)
            if ids:
                dev = ids[0].device
                flat = torch.cat([t.detach().reshape(-1).to(dev, torch.int64) for t in ids])
                host_i = torch.empty(flat.shape, dtype=torch.int64, pin_memory=True)
                host_i.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        if len(self._pending) >= _MAX_PENDING:
            self._pending.pop(0)
            self._pending_dropped += 1
        layout = [(pos, key, _is_ids(t, torch), t.numel()) for (pos, key), t in devices]
        self._pending.append(("step", (step, values, stamp), (host_f, host_i, layout), event))

    def _resolve(self, wait):
        """Hands finished pending entries, in order, to the C++ queue. With
        wait, waits for every CUDA copy first (flush/close only)."""
        pending = self._pending
        while pending:
            entry = pending[0]
            if entry[0] == "event":
                self._c.event(*entry[1])
                pending.pop(0)
                continue
            _, (step, values, stamp), buffers, event = entry
            if event is not None:
                if wait:
                    event.synchronize()
                elif not event.query():
                    return
                _fill_from_host(values, buffers)
            pending.pop(0)
            self._submit(step, values, stamp)


# Client()'s arguments; it names RunStart.run_id `run`.
_init = Client.__init__.__code__
_check_fields("RUN_START_FIELDS",
              ["run_id" if a == "run" else a for a in _init.co_varnames[:_init.co_argcount]],
              "Client()")
del _init
