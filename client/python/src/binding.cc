// _trainwatch: the pybind11 binding of trainwatch::Client (client.h). The
// public Python API is the thin layer in trainwatch/client.py; this module
// is its private engine.
//
// record() is the hot path (once per optimizer step, budget 2 us from Python).
// It takes its fields positionally as raw handles and converts only plain
// Python values (float, int, bool, None, lists of ints, dicts of tuples)
// itself. Anything else (a numpy scalar, a torch tensor) makes it return
// kDeferred without recording, and the Python layer converts the values and
// calls again; so the common float path costs one call and no allocations
// beyond the Step itself. It keeps the GIL: Record() is a ~100 ns queue push,
// far less than a release/reacquire pair. Flush() and Close() wait on the
// network and release it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "trainwatch/client.h"
#include "trainwatch/restart_plan.h"
#include "trainwatch/run_start_fields.h"
#include "trainwatch/step_fields.h"
#include "trainwatch/v1/clipping.h"

namespace py = pybind11;

namespace trainwatch {
namespace {

// record()'s result codes (the Python layer mirrors them).
constexpr int kDropped = 0;
constexpr int kRecorded = 1;
constexpr int kDeferred = -1;

// The tuples the Python layer hands over, item by item, follow the field
// tables (step_fields.h, run_start_fields.h): a field added to a table does
// not compile here until the code that reads the tuple reads it too.
#define TW_ONE(...) +1
constexpr int kFp8TupleSize = 8;
static_assert(kFp8TupleSize == 0 TRAINWATCH_FIELDS(TRAINWATCH_FP8_STAT_FIELDS, TW_ONE),
              "Fp8StatEntry reads one item per Fp8TensorStats field");
constexpr int kMoeTupleSize = 7;
static_assert(kMoeTupleSize == 0 TRAINWATCH_FIELDS(TRAINWATCH_MOE_LAYER_STAT_FIELDS, TW_ONE),
              "MoeEntries reads one item per MoeLayerStats field");
// Three or four numbers; the kind comes from set_layer_kinds().
static_assert(4 + 1 == 0 TRAINWATCH_FIELDS(TRAINWATCH_LAYER_STAT_FIELDS, TW_ONE),
              "LayerStatEntry reads every LayerStats field but kind");

// A plain Python number as a double: float (numpy.float64 is a float
// subclass), int or bool. False for anything else, with no error set.
bool PlainDouble(PyObject* o, double* out) {
  if (PyFloat_Check(o)) {
    *out = PyFloat_AS_DOUBLE(o);
    return true;
  }
  if (PyLong_Check(o)) {
    const double d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {  // too large for a double
      PyErr_Clear();
      return false;
    }
    *out = d;
    return true;
  }
  return false;
}

bool OptionalDouble(PyObject* o, std::optional<double>* out) {
  if (o == Py_None) return true;  // stays nullopt
  double d;
  if (!PlainDouble(o, &d)) return false;
  *out = d;
  return true;
}

// None, a non-negative int, or a float holding one (a count read back from
// a device tensor as float64).
bool OptionalCount(PyObject* o, std::optional<uint64_t>* out) {
  if (o == Py_None) return true;
  if (PyLong_CheckExact(o)) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      return false;  // negative
    }
    *out = v;
    return true;
  }
  if (PyFloat_CheckExact(o)) {
    const double d = PyFloat_AS_DOUBLE(o);
    if (!(d >= 0 && d < 18446744073709551616.0) || d != std::floor(d)) return false;
    *out = static_cast<uint64_t>(d);
    return true;
  }
  return false;
}

// True, False, 0 or 1 (ints are what bool(tensor) users sometimes pass).
bool PlainBool(PyObject* o, bool* out) {
  if (o == Py_True || o == Py_False) {
    *out = o == Py_True;
    return true;
  }
  if (PyLong_CheckExact(o)) {
    const long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    *out = v != 0;
    return true;
  }
  return false;
}

// A list or tuple of Python ints.
bool BatchIds(PyObject* o, std::vector<int64_t>* out) {
  if (o == Py_None) return true;
  if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
  PyObject* fast = o;  // lists and tuples are already "fast" sequences
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  out->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyLong_Check(items[i])) return false;
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    out->push_back(v);
  }
  return true;
}

// A dict key as a std::string; false (no error set) for anything else.
bool KeyString(PyObject* key, std::string* out) {
  if (!PyUnicode_Check(key)) return false;
  Py_ssize_t size;
  const char* name = PyUnicode_AsUTF8AndSize(key, &size);
  if (name == nullptr) {
    PyErr_Clear();
    return false;
  }
  out->assign(name, static_cast<size_t>(size));
  return true;
}

// None, or a dict of str to values `parse` reads into a T, into `out`;
// false (no error set) for anything else.
template <typename T, typename Parse>
bool NamedEntries(PyObject* o, std::map<std::string, T>* out, Parse parse) {
  if (o == Py_None) return true;
  if (!PyDict_Check(o)) return false;
  PyObject* key;
  PyObject* value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(o, &pos, &key, &value)) {
    T entry;
    std::string name;
    if (!parse(value, &entry) || !KeyString(key, &name)) return false;
    (*out)[std::move(name)] = std::move(entry);
  }
  return true;
}

// A layer's (grad_norm, grad_rms, g_over_sqrt_v_rms[, update_rms_ratio]) as
// a tuple or list of three or four plain numbers (the fourth may be None:
// not measured).
bool LayerStatEntry(PyObject* value, LayerStat* stat) {
  if (!PyList_Check(value) && !PyTuple_Check(value)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
  if (n != 3 && n != 4) return false;
  PyObject** items = PySequence_Fast_ITEMS(value);
  return PlainDouble(items[0], &stat->grad_norm) &&
         PlainDouble(items[1], &stat->grad_rms) &&
         PlainDouble(items[2], &stat->g_over_sqrt_v_rms) &&
         (n == 3 || OptionalDouble(items[3], &stat->update_rms_ratio));
}

// A tensor's (format, amax, scale, amax_history_len, margin,
// overflow_fraction, underflow_fraction, amax_group), the tuple the Python
// layer builds from the user's dict (format an int 1..4, the fractions
// numbers or None, amax_group a str).
bool Fp8StatEntry(PyObject* value, Fp8Stat* stat) {
  if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != kFp8TupleSize) return false;
  PyObject** items = PySequence_Fast_ITEMS(value);
  double format = 0;
  double history = 0;
  if (!PlainDouble(items[0], &format) || !PlainDouble(items[1], &stat->amax) ||
      !PlainDouble(items[2], &stat->scale) || !PlainDouble(items[3], &history) ||
      !PlainDouble(items[4], &stat->margin) ||
      !OptionalDouble(items[5], &stat->overflow_fraction) ||
      !OptionalDouble(items[6], &stat->underflow_fraction) ||
      !KeyString(items[7], &stat->amax_group)) {
    return false;
  }
  if (!(format >= 1 && format <= 4) || !(history >= 0 && history <= 4294967295.0)) {
    return false;
  }
  stat->format = static_cast<Fp8Format>(static_cast<int>(format));
  stat->amax_history_len = static_cast<uint32_t>(history);
  return true;
}

// A list or tuple of plain numbers into `out` (ints for counts).
template <typename T>
bool PlainNumbers(PyObject* o, std::vector<T>* out) {
  if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  out->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>) {
      if (!PyLong_Check(items[i])) return false;
      const unsigned long long v = PyLong_AsUnsignedLongLong(items[i]);
      if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      out->push_back(static_cast<T>(v));
    } else {
      double d;
      if (!PlainDouble(items[i], &d)) return false;
      out->push_back(static_cast<T>(d));
    }
  }
  return true;
}

// None, or a list of the Python layer's MoE layer tuples (layer, counts,
// dropped, aux_loss, z_loss, bias, router_logit_max), counts and bias lists
// of plain numbers, the scalars numbers or None.
bool MoeEntries(PyObject* o, std::vector<MoeLayerStat>* out) {
  if (o == Py_None) return true;
  if (!PyList_Check(o)) return false;
  const Py_ssize_t n = PyList_GET_SIZE(o);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = PyList_GET_ITEM(o, i);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != kMoeTupleSize) return false;
    PyObject** items = PySequence_Fast_ITEMS(t);
    MoeLayerStat stat;
    std::optional<double> dropped;
    if (!KeyString(items[0], &stat.layer) ||
        !PlainNumbers(items[1], &stat.tokens_per_expert) ||
        !OptionalDouble(items[2], &dropped) || !OptionalDouble(items[3], &stat.aux_loss) ||
        !OptionalDouble(items[4], &stat.z_loss) || !PlainNumbers(items[5], &stat.expert_bias) ||
        !OptionalDouble(items[6], &stat.router_logit_max)) {
      return false;
    }
    if (dropped) {
      if (!(*dropped >= 0 && *dropped <= 1.8e19)) return false;
      stat.dropped = static_cast<uint64_t>(*dropped);
    }
    out->push_back(std::move(stat));
  }
  return true;
}

// Raises the Python exception a user expects: ValueError for bad arguments,
// TimeoutError for a deadline, RuntimeError otherwise.
void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    throw py::value_error(std::string(status.message()));
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    PyErr_SetString(PyExc_TimeoutError, std::string(status.message()).c_str());
    throw py::error_already_set();
  }
  if (status.code() == absl::StatusCode::kUnauthenticated ||
      status.code() == absl::StatusCode::kPermissionDenied) {
    PyErr_SetString(PyExc_PermissionError, status.ToString().c_str());
    throw py::error_already_set();
  }
  if (status.code() == absl::StatusCode::kNotFound) {
    PyErr_SetString(PyExc_FileNotFoundError,
                    std::string(status.message()).c_str());
    throw py::error_already_set();
  }
  throw std::runtime_error(status.ToString());
}

std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds >= 0)) throw py::value_error("timeout must be >= 0 seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// A directive as `trainwatchctl directives --json` shows one (json_out.cc):
// id, seq, for_attempt, apply_at_step, alert, reason, approved_by, action
// (its name: checkpoint_now, skip, rollback, scale_lr, stop) and, under the
// action's name, its fields.
py::dict DirectiveDict(const Directive& d) {
  py::dict out;
  out["id"] = d.id;
  out["seq"] = d.seq;
  out["for_attempt"] = d.for_attempt;
  out["apply_at_step"] = d.apply_at_step;
  out["alert"] = d.alert;
  out["reason"] = d.reason;
  out["approved_by"] = d.approved_by;
  py::dict fields;
  const char* action = "";
  switch (d.action) {
    case Directive::Action::kCheckpointNow:
      action = "checkpoint_now";
      fields["tag"] = d.checkpoint_tag;
      break;
    case Directive::Action::kSkip:
      action = "skip";
      fields["batch_ids"] = d.skip_batch_ids;
      break;
    case Directive::Action::kRollback:
      action = "rollback";
      fields["to_step"] = d.rollback_to_step;
      fields["checkpoint"] = d.rollback_checkpoint;
      fields["skip_batch_ids"] = d.skip_batch_ids;
      fields["lr_scale"] = d.lr_scale;
      break;
    case Directive::Action::kScaleLr:
      action = "scale_lr";
      fields["factor"] = d.lr_scale;
      break;
    case Directive::Action::kStop:
      action = "stop";
      fields["checkpoint_first"] = d.checkpoint_first;
      break;
    case Directive::Action::kNone:
      break;
  }
  out["action"] = action;
  if (*action != '\0') out[action] = fields;
  return out;
}

// Owns the C++ client. Thread-safety: as trainwatch::Client's.
class PyClient {
 public:
  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  ~PyClient() {
    // ~Client closes with a short flush; the background thread never takes
    // the GIL, so letting other Python threads run meanwhile is safe.
    py::gil_scoped_release release;
    client_.reset();
  }

  // Fields in the order of the Python layer's record(); see the file comment.
  // Called through FastRecord (below), not pybind11's dispatcher.
  int Record(py::handle step, py::handle grad_norm, py::handle loss,
             py::handle loss_scale, py::handle skipped, py::handle clipped,
             py::handle clip_coef, py::handle max_attn_logit, py::handle log_z,
             py::handle lr, py::handle step_time_s, py::handle data_wait_s,
             py::handle tokens, py::handle rank, py::handle batch_ids,
             py::handle shard_sq_sum,
             py::handle layer_stats, py::handle fp8, py::handle moe,
             int64_t time_unix_nanos) {
    Step s;
    PyObject* step_obj = step.ptr();
    if (!PyLong_Check(step_obj)) return kDeferred;
    s.step = PyLong_AsUnsignedLongLong(step_obj);
    if (s.step == static_cast<uint64_t>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      return kDeferred;  // negative: the Python layer raises a clear error
    }
    if (!PlainDouble(grad_norm.ptr(), &s.grad_norm)) return kDeferred;
    if (!OptionalDouble(loss.ptr(), &s.loss) ||
        !OptionalDouble(loss_scale.ptr(), &s.loss_scale) ||
        !PlainBool(skipped.ptr(), &s.skipped) ||
        !OptionalDouble(clip_coef.ptr(), &s.clip_coef) ||
        !OptionalDouble(max_attn_logit.ptr(), &s.max_attn_logit) ||
        !OptionalDouble(log_z.ptr(), &s.log_z) ||
        !OptionalDouble(lr.ptr(), &s.lr) ||
        !OptionalDouble(step_time_s.ptr(), &s.step_time_s) ||
        !OptionalDouble(data_wait_s.ptr(), &s.data_wait_s) ||
        !OptionalDouble(shard_sq_sum.ptr(), &s.shard_sq_sum) ||
        !OptionalCount(tokens.ptr(), &s.tokens)) {
      return kDeferred;
    }
    if (std::optional<uint64_t> r; !OptionalCount(rank.ptr(), &r) || r > UINT32_MAX) {
      return kDeferred;
    } else if (r.has_value()) {
      s.rank = static_cast<uint32_t>(*r);
    }
    if (clipped.ptr() != Py_None) {
      bool b;
      if (!PlainBool(clipped.ptr(), &b)) return kDeferred;
      s.clipped = b;
    }
    if (!BatchIds(batch_ids.ptr(), &s.batch_ids) ||
        !NamedEntries(layer_stats.ptr(), &s.layer_stats, LayerStatEntry) ||
        !NamedEntries(fp8.ptr(), &s.fp8, Fp8StatEntry) || !MoeEntries(moe.ptr(), &s.moe)) {
      return kDeferred;
    }
    if (!layer_kinds_.empty()) {
      for (auto& [name, stat] : s.layer_stats) {
        auto it = layer_kinds_.find(name);
        if (it != layer_kinds_.end()) stat.kind = it->second;
      }
    }
    s.time_unix_nanos = time_unix_nanos;
    return client_->Record(std::move(s)) ? kRecorded : kDropped;
  }

  bool Event(int kind, uint64_t step, std::string detail) {
    if (kind < 1 || kind > 3) throw py::value_error("unknown event kind");
    return client_->RecordEvent(static_cast<EventKind>(kind), step,
                                std::move(detail));
  }

  void Flush(double timeout_s) {
    const auto timeout = Millis(timeout_s);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Flush(timeout);
    }
    ThrowIfError(status);
  }

  void Close(double timeout_s) {
    const auto timeout = Millis(timeout_s);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Close(timeout);
    }
    ThrowIfError(status);
  }

  py::tuple Stats() const {
    const ClientStats s = client_->Stats();
    return py::make_tuple(s.recorded, s.sent, s.acked, s.dropped, s.reconnects,
                          s.rejected);
  }

  // The kinds of the layers that layer_stats names (LayerKind codes 1..5),
  // from the model's modules; sent with every layer stat of those names.
  void SetLayerKinds(const std::map<std::string, int>& kinds) {
    layer_kinds_.clear();
    for (const auto& [name, code] : kinds) {
      if (code < 1 || code > 5) throw py::value_error("unknown layer kind " + std::to_string(code));
      layer_kinds_[name] = static_cast<LayerKind>(code);
    }
  }

  // None, or "CODE: message" of the server's refusal (Client::Refusal()).
  py::object Refusal() const {
    const absl::Status status = client_->Refusal();
    if (status.ok()) return py::none();
    return py::str(status.ToString());
  }

  // The closed loop (Client::DueDirectives): the directives due at `step`
  // that this client has not answered, by seq, as DirectiveDict makes them.
  py::list DueDirectives(uint64_t step) {
    py::list out;
    for (const Directive& d : client_->DueDirectives(step)) out.append(DirectiveDict(d));
    return out;
  }

  // `state` is a DirectiveState code (1 RECEIVED, 2 APPLIED, 3 REJECTED).
  bool AckDirective(const std::string& id, int state, std::string detail) {
    if (state < 1 || state > 3) throw py::value_error("unknown directive state");
    return client_->AckDirective(id, static_cast<DirectiveState>(state), std::move(detail));
  }

  py::object RecommendedMaxNorm() const {
    const std::optional<double> v = client_->RecommendedMaxNorm();
    if (!v.has_value()) return py::none();
    return py::float_(*v);
  }

 private:
  std::unique_ptr<Client> client_;
  // Set from Python with the GIL held, read by Record() under it.
  std::map<std::string, LayerKind> layer_kinds_;
};

// record() as a METH_FASTCALL builtin bound to a capsule of the PyClient:
// pybind11's dispatcher (argument vectors, overload loop, casts) cost more
// than the rest of record() together. The capsule's context holds a
// reference to the pybind11 object, so the function keeps its client alive.
constexpr int kRecordArgs = 20;
static_assert(kRecordArgs == 0 TRAINWATCH_FIELDS(TRAINWATCH_STEP_FIELDS, TW_ONE),
              "record() takes one argument per StepRecord field");

PyObject* FastRecord(PyObject* capsule, PyObject* const* args,
                     Py_ssize_t nargs) {
  if (nargs != kRecordArgs) {
    PyErr_Format(PyExc_TypeError, "record takes %d arguments (%zd given)",
                 kRecordArgs, nargs);
    return nullptr;
  }
  auto* client = static_cast<PyClient*>(PyCapsule_GetPointer(capsule, nullptr));
  if (client == nullptr) return nullptr;
  const long long stamp = PyLong_AsLongLong(args[kRecordArgs - 1]);
  if (stamp == -1 && PyErr_Occurred()) return nullptr;
  const int r = client->Record(args[0], args[1], args[2], args[3], args[4],
                               args[5], args[6], args[7], args[8], args[9],
                               args[10], args[11], args[12], args[13], args[14],
                               args[15], args[16], args[17], args[18], stamp);
  return PyLong_FromLong(r);  // a cached small int
}

PyMethodDef fast_record_def = {
    "record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(FastRecord)),
    METH_FASTCALL, "record(step, grad_norm, ..., time_unix_nanos) -> int"};

void ReleaseClientRef(PyObject* capsule) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(capsule)));
}

py::object MakeFastRecord(py::object self) {
  PyClient* client = self.cast<PyClient*>();
  py::object capsule = py::reinterpret_steal<py::object>(
      PyCapsule_New(client, nullptr, ReleaseClientRef));
  if (!capsule) throw py::error_already_set();
  if (PyCapsule_SetContext(capsule.ptr(), self.release().ptr()) != 0) {
    throw py::error_already_set();
  }
  py::object f = py::reinterpret_steal<py::object>(
      PyCFunction_NewEx(&fast_record_def, capsule.ptr(), nullptr));
  if (!f) throw py::error_already_set();
  return f;
}

// Client(moe=...) as the Python layer's _moe_config() gives it.
using MoeConfigTuple =
    std::tuple<uint32_t, uint32_t, uint32_t, int, double, double, double, double>;
static_assert(std::tuple_size_v<MoeConfigTuple> ==
                  0 TRAINWATCH_FIELDS(TRAINWATCH_MOE_CONFIG_FIELDS, TW_ONE),
              "CreateClient reads one item per MoeConfig field");

std::unique_ptr<PyClient> CreateClient(
    std::string address, std::string run_id, uint32_t rank, uint32_t world_size,
    uint32_t attempt, const std::string& precision, double max_norm,
    uint64_t warmup_steps, uint32_t scaler_growth_interval,
    std::optional<double> adam_eps, std::optional<double> adam_beta2,
    std::map<std::string, std::string> labels, size_t capacity,
    std::string auth_token, bool tls, std::string tls_ca_file,
    std::string tls_cert_file, std::string tls_key_file, std::string host,
    std::optional<MoeConfigTuple> moe, uint64_t last_applied_directive,
    const std::vector<std::pair<std::string, uint32_t>>& baselines,
    const std::vector<uint32_t>& local_ranks) {
  ClientOptions options;
  options.last_applied_directive = last_applied_directive;
  options.local_ranks = local_ranks;
  for (const auto& [run, attempt] : baselines) {
    options.baselines.push_back(BaselineRef{.run = run, .attempt = attempt});
  }
  if (moe) {
    const auto& [experts, top_k, ep_size, balancing, aux, z, rate, capacity] = *moe;
    if (balancing < 0 || balancing > 5) throw py::value_error("unknown MoE balancing");
    options.moe = MoeConfig{.num_experts = experts, .top_k = top_k, .ep_size = ep_size,
                            .balancing = static_cast<MoeBalancing>(balancing),
                            .aux_loss_coeff = aux, .z_loss_coeff = z,
                            .bias_update_rate = rate, .capacity_factor = capacity};
  }
  options.host = std::move(host);  // "": this machine's hostname
  options.address = std::move(address);
  options.security.auth_token = std::move(auth_token);
  options.security.tls = tls;
  options.security.tls_ca_file = std::move(tls_ca_file);
  options.security.tls_cert_file = std::move(tls_cert_file);
  options.security.tls_key_file = std::move(tls_key_file);
  options.run_id = std::move(run_id);
  options.rank = rank;
  options.world_size = world_size;
  options.attempt = attempt;
  const std::optional<Precision> p = ParsePrecision(precision);
  if (!p.has_value()) {
    throw py::value_error("precision must be \"fp32\", \"bf16\" or \"fp16\", got \"" +
                          precision + "\"");
  }
  options.precision = *p;
  options.max_norm = max_norm;
  options.warmup_steps = warmup_steps;
  options.scaler_growth_interval = scaler_growth_interval;
  options.adam_eps = adam_eps;
  options.adam_beta2 = adam_beta2;
  options.labels = std::move(labels);
  options.capacity = capacity;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(std::move(options));
  if (!client.ok()) ThrowIfError(client.status());
  return std::make_unique<PyClient>(*std::move(client));
}

// GetRunHealth -> the latest spike's plan as a dict, or None without a spike.
py::object FetchPlan(const std::string& address, const std::string& run,
                     std::string auth_token, bool tls, std::string tls_ca_file,
                     std::string tls_cert_file, std::string tls_key_file,
                     double timeout_s) {
  ConnectionSecurity security;
  security.auth_token = std::move(auth_token);
  security.tls = tls;
  security.tls_ca_file = std::move(tls_ca_file);
  security.tls_cert_file = std::move(tls_cert_file);
  security.tls_key_file = std::move(tls_key_file);
  const auto timeout = Millis(timeout_s);
  absl::StatusOr<std::optional<RestartPlan>> plan;
  {
    py::gil_scoped_release release;
    plan = FetchRestartPlan(address, security, run, timeout);
  }
  if (!plan.ok()) ThrowIfError(plan.status());
  if (!plan->has_value()) return py::none();
  const RestartPlan& p = **plan;
  py::dict out;
  out["run"] = p.run;
  out["spike_step"] = p.spike_step;
  out["restart_from_step"] =
      p.restart_from_step.has_value() ? py::object(py::int_(*p.restart_from_step))
                                      : py::object(py::none());
  out["checkpoint"] = p.checkpoint;
  out["skip_batch_ids"] = p.skip_batch_ids;
  out["outcome"] = p.outcome;
  out["batches_skipped"] = p.batches_skipped;
  out["why"] = p.why;
  return out;
}

}  // namespace
}  // namespace trainwatch

PYBIND11_MODULE(_trainwatch, m) {
  using trainwatch::PyClient;
  m.doc() = "Binding of the trainwatch C++ client; use the trainwatch package.";
  m.attr("RECORDED") = trainwatch::kRecorded;
  m.attr("DROPPED") = trainwatch::kDropped;
  m.attr("DEFERRED") = trainwatch::kDeferred;
  // The field tables' names (step_fields.h, run_start_fields.h): the
  // Python layer checks at import that record() and Client() take each.
#define TW_NAME(name, ...) #name,
  const auto names = [](std::initializer_list<const char*> fields) {
    py::tuple out(fields.size());
    size_t i = 0;
    for (const char* f : fields) out[i++] = py::str(f);
    return out;
  };
  m.attr("STEP_FIELDS") = names({TRAINWATCH_FIELDS(TRAINWATCH_STEP_FIELDS, TW_NAME)});
  m.attr("LAYER_STAT_FIELDS") =
      names({TRAINWATCH_FIELDS(TRAINWATCH_LAYER_STAT_FIELDS, TW_NAME)});
  m.attr("FP8_STAT_FIELDS") = names({TRAINWATCH_FIELDS(TRAINWATCH_FP8_STAT_FIELDS, TW_NAME)});
  m.attr("MOE_LAYER_STAT_FIELDS") =
      names({TRAINWATCH_FIELDS(TRAINWATCH_MOE_LAYER_STAT_FIELDS, TW_NAME)});
  m.attr("RUN_START_FIELDS") =
      names({TRAINWATCH_FIELDS(TRAINWATCH_RUN_START_FIELDS, TW_NAME)});
  m.attr("MOE_CONFIG_FIELDS") =
      names({TRAINWATCH_FIELDS(TRAINWATCH_MOE_CONFIG_FIELDS, TW_NAME)});
#undef TW_NAME

  // clip_grad_norm_'s (clipped, coefficient) for a float norm, as the C++
  // client derives them (trainwatch/v1/clipping.h).
  m.def(
      "clip_fields",
      [](double grad_norm, double max_norm) {
        return py::make_tuple(trainwatch::v1::ClippedAt(max_norm, grad_norm),
                              trainwatch::v1::ClipCoef(max_norm, grad_norm));
      },
      py::arg("grad_norm"), py::arg("max_norm"));
  // The proto's enums the Python layer takes by name, from their
  // descriptors: {enum: {value name: number}} (trainwatch/_fields.py builds
  // its tables from them, so a value added to the proto reaches Python).
  {
    namespace v1 = trainwatch::v1;
    py::dict enums;
    for (const google::protobuf::EnumDescriptor* d :
         {v1::LayerKind_descriptor(), v1::MoeBalancing_descriptor(), v1::Fp8Format_descriptor(),
          v1::EventKind_descriptor(), v1::DirectiveState_descriptor(),
          v1::Precision_descriptor()}) {
      py::dict values;
      for (int i = 0; i < d->value_count(); ++i) {
        values[py::str(std::string(d->value(i)->name()))] = d->value(i)->number();
      }
      enums[py::str(std::string(d->name()))] = values;
    }
    m.attr("ENUMS") = enums;
  }
  m.def("restart_plan", &trainwatch::FetchPlan, py::arg("address"),
        py::arg("run"), py::arg("auth_token"), py::arg("tls"),
        py::arg("tls_ca_file"), py::arg("tls_cert_file"),
        py::arg("tls_key_file"), py::arg("timeout"));

  py::class_<PyClient>(m, "Client")
      .def(py::init(&trainwatch::CreateClient), py::arg("address"),
           py::arg("run_id"), py::arg("rank"), py::arg("world_size"),
           py::arg("attempt"), py::arg("precision"), py::arg("max_norm"),
           py::arg("warmup_steps"), py::arg("scaler_growth_interval"),
           py::arg("adam_eps"), py::arg("adam_beta2"), py::arg("labels"),
           py::arg("capacity"), py::arg("auth_token"), py::arg("tls"),
           py::arg("tls_ca_file"), py::arg("tls_cert_file"),
           py::arg("tls_key_file"), py::arg("host"), py::arg("moe") = py::none(),
           py::arg("last_applied_directive") = 0,
           py::arg("baselines") = std::vector<std::pair<std::string, uint32_t>>{},
           py::arg("local_ranks") = std::vector<uint32_t>{})
      // Positional only: keyword matching would cost more than Record().
      .def("record", &PyClient::Record)
      // The same, as a builtin that skips pybind11's dispatcher (hot path).
      .def("fast_record", &trainwatch::MakeFastRecord)
      .def("event", &PyClient::Event)
      .def("flush", &PyClient::Flush)
      .def("close", &PyClient::Close)
      .def("stats", &PyClient::Stats)
      .def("recommended_max_norm", &PyClient::RecommendedMaxNorm)
      .def("due_directives", &PyClient::DueDirectives)
      .def("ack_directive", &PyClient::AckDirective)
      .def("refusal", &PyClient::Refusal)
      .def("set_layer_kinds", &PyClient::SetLayerKinds);
}
