// The Python module `mtrt`: the C API (mtrt/mtrt.h) with tensors in and out
// through DLPack (NumPy, PyTorch, CuPy, ...) or the buffer protocol.
//
// Only the public C API is used, so the module is a client of libmtrt.so
// like any other embedding program.
#include "mtrt/mtrt.h"

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

py::object errorType;

/// Raises mtrt.Error for a non-NULL status, freeing it: the message is
/// "CODE: message", and the exception's `code` attribute is the code's name.
void check(mtrt_status_t status) {
  if (!status)
    return;
  std::string code = mtrt_status_code_string(mtrt_status_code(status));
  std::string message = code + ": " + mtrt_status_message(status);
  mtrt_status_free(status);
  py::object error = errorType(message);
  error.attr("code") = code;
  PyErr_SetObject(errorType.ptr(), error.ptr());
  throw py::error_already_set();
}

/// Runs a C call without the GIL, so that ranks on Python threads step
/// concurrently, then raises its status.
template <typename Fn> void callReleased(Fn &&fn) {
  mtrt_status_t status;
  {
    py::gil_scoped_release release;
    status = fn();
  }
  check(status);
}

[[noreturn]] void invalid(const std::string &message) {
  throw py::value_error(message);
}

/// A tensor taken from Python: its descriptor and what keeps its memory
/// alive (the consumed DLPack tensor, or the buffer view and its owner).
struct HeldTensor {
  mtrt_tensor_t tensor{};
  DLManagedTensor *managed = nullptr;
  std::unique_ptr<py::buffer_info> buffer;
  py::object owner;

  HeldTensor() = default;
  HeldTensor(const HeldTensor &) = delete;
  HeldTensor &operator=(const HeldTensor &) = delete;
  ~HeldTensor() {
    if (managed && managed->deleter)
      managed->deleter(managed);
  }
};

mtrt_dtype_t fromDLDataType(DLDataType type, const std::string &what) {
  if (type.lanes == 1) {
    if (type.code == kDLInt && type.bits == 32)
      return MTRT_DTYPE_I32;
    if (type.code == kDLInt && type.bits == 64)
      return MTRT_DTYPE_I64;
    if (type.code == kDLFloat && type.bits == 32)
      return MTRT_DTYPE_F32;
    if (type.code == kDLFloat && type.bits == 64)
      return MTRT_DTYPE_F64;
  }
  invalid(what + ": DLPack dtype (code " + std::to_string(type.code) +
          ", bits " + std::to_string(type.bits) + ", lanes " +
          std::to_string(type.lanes) +
          ") is not supported; expected int32, int64, float32 or float64");
}

DLDataType toDLDataType(mtrt_dtype_t dtype) {
  switch (dtype) {
  case MTRT_DTYPE_I32:
    return {kDLInt, 32, 1};
  case MTRT_DTYPE_I64:
    return {kDLInt, 64, 1};
  case MTRT_DTYPE_F64:
    return {kDLFloat, 64, 1};
  case MTRT_DTYPE_BF16:
    return {kDLBfloat, 16, 1};
  case MTRT_DTYPE_F16:
    return {kDLFloat, 16, 1};
  case MTRT_DTYPE_F32:
    break;
  }
  return {kDLFloat, 32, 1};
}

mtrt_dtype_t fromBufferFormat(const py::buffer_info &info,
                              const std::string &what) {
  char kind = info.format.empty() ? '?' : info.format.back();
  if ((kind == 'i' || kind == 'l' || kind == 'q') && info.itemsize == 4)
    return MTRT_DTYPE_I32;
  if ((kind == 'i' || kind == 'l' || kind == 'q') && info.itemsize == 8)
    return MTRT_DTYPE_I64;
  if (kind == 'f' && info.itemsize == 4)
    return MTRT_DTYPE_F32;
  if (kind == 'd' && info.itemsize == 8)
    return MTRT_DTYPE_F64;
  invalid(what + ": buffer format '" + info.format +
          "' is not supported; expected int32, int64, float32 or float64");
}

void setShape(mtrt_tensor_t &t, int rank, const int64_t *shape,
              const std::string &what) {
  if (rank < 0 || rank > MTRT_MAX_RANK)
    invalid(what + ": " + std::to_string(rank) +
            " dimensions, at most " + std::to_string(MTRT_MAX_RANK));
  t.rank = rank;
  for (int d = 0; d < rank; ++d)
    t.shape[d] = shape[d];
}

/// Whether `strides` (elements; NULL = row-major) describe a dense
/// row-major tensor; size-1 dimensions may have any stride.
bool isRowMajor(int rank, const int64_t *shape, const int64_t *strides) {
  if (!strides)
    return true;
  int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected)
      return false;
    expected *= shape[d];
  }
  return true;
}

/// Takes `object` as a tensor: through __dlpack__ (with `stream`, a CUDA
/// stream the producer orders its work before, or None) or the buffer
/// protocol.
std::unique_ptr<HeldTensor> takeTensor(py::handle object,
                                       const std::string &what,
                                       py::object stream) {
  auto held = std::make_unique<HeldTensor>();
  held->owner = py::reinterpret_borrow<py::object>(object);
  if (py::hasattr(object, "__dlpack__")) {
    // Only a producer on a CUDA device takes a stream (NumPy refuses one).
    if (!stream.is_none() && py::hasattr(object, "__dlpack_device__")) {
      py::tuple device = object.attr("__dlpack_device__")();
      if (device[0].cast<int>() != kDLCUDA)
        stream = py::none();
    }
    py::object capsule = stream.is_none()
                             ? object.attr("__dlpack__")()
                             : object.attr("__dlpack__")(py::arg("stream") =
                                                             stream);
    PyObject *raw = capsule.ptr();
    auto *managed = static_cast<DLManagedTensor *>(
        PyCapsule_GetPointer(raw, "dltensor"));
    if (!managed)
      throw py::error_already_set();
    // The capsule is consumed: we own the tensor and call its deleter.
    PyCapsule_SetName(raw, "used_dltensor");
    held->managed = managed;
    const DLTensor &dl = managed->dl_tensor;
    mtrt_tensor_t &t = held->tensor;
    t.data = static_cast<char *>(dl.data) + dl.byte_offset;
    t.dtype = fromDLDataType(dl.dtype, what);
    setShape(t, dl.ndim, dl.shape, what);
    if (!isRowMajor(dl.ndim, dl.shape, dl.strides))
      invalid(what + " is not contiguous; pass a contiguous tensor (e.g. "
                     ".contiguous() in PyTorch, np.ascontiguousarray)");
    switch (dl.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      t.backend = MTRT_BACKEND_HOST;
      t.device = 0;
      break;
    case kDLCUDA:
      t.backend = MTRT_BACKEND_CUDA;
      t.device = dl.device.device_id;
      break;
    default:
      invalid(what + ": DLPack device type " +
              std::to_string(dl.device.device_type) +
              " is not supported; expected CPU or CUDA memory");
    }
    return held;
  }
  if (!PyObject_CheckBuffer(object.ptr()))
    invalid(what + " is a " +
            std::string(py::str(py::type::of(object).attr("__name__"))) +
            ", which has neither __dlpack__ nor the buffer protocol");
  held->buffer = std::make_unique<py::buffer_info>(
      py::reinterpret_borrow<py::buffer>(object).request());
  const py::buffer_info &info = *held->buffer;
  mtrt_tensor_t &t = held->tensor;
  t.data = info.ptr;
  t.dtype = fromBufferFormat(info, what);
  std::vector<int64_t> shape(info.shape.begin(), info.shape.end());
  std::vector<int64_t> strides;
  for (py::ssize_t s : info.strides)
    strides.push_back(s / info.itemsize);
  setShape(t, static_cast<int>(info.ndim), shape.data(), what);
  if (!isRowMajor(static_cast<int>(info.ndim), shape.data(), strides.data()))
    invalid(what + " is not contiguous");
  t.backend = MTRT_BACKEND_HOST;
  return held;
}

py::dict metricsDict(const mtrt_step_metrics_t &m) {
  py::dict d;
  d["iteration"] = m.iteration;
  d["micro_batches"] = m.micro_batches;
  d["loss"] = m.loss;
  d["grad_norm"] = m.grad_norm;
  d["learning_rate"] = m.learning_rate;
  // fp16 bundles: the loss scale after the step, and whether it skipped.
  d["loss_scale"] = m.loss_scale;
  d["skipped"] = m.skipped != 0;
  return d;
}

struct Bundle {
  explicit Bundle(const std::string &path) {
    mtrt_bundle_t bundle = nullptr;
    callReleased([&] { return mtrt_bundle_load(path.c_str(), &bundle); });
    handle.reset(bundle);
  }
  struct Release {
    void operator()(mtrt_bundle_t b) const { mtrt_bundle_release(b); }
  };
  std::unique_ptr<mtrt_bundle_s, Release> handle;
};

struct Communicator {
  struct Release {
    void operator()(mtrt_communicator_t c) const {
      mtrt_communicator_release(c);
    }
  };
  std::unique_ptr<mtrt_communicator_s, Release> handle;
  int rank() const {
    int r = 0;
    check(mtrt_communicator_rank(handle.get(), &r));
    return r;
  }
  int size() const {
    int s = 0;
    check(mtrt_communicator_size(handle.get(), &s));
    return s;
  }
};

class Session;

/// A zero-copy view of a session's parameter, exported through DLPack; it
/// keeps the session alive.
struct ParameterView {
  py::object session;
  mtrt_tensor_t tensor{};
  std::string name;
};

struct ExportContext {
  py::object owner;
  std::vector<int64_t> shape;
};

void deleteExported(DLManagedTensor *managed) {
  auto *context = static_cast<ExportContext *>(managed->manager_ctx);
  {
    py::gil_scoped_acquire gil;
    delete context;
  }
  delete managed;
}

py::capsule exportView(const ParameterView &view, py::object owner) {
  auto *context = new ExportContext{std::move(owner), {}};
  context->shape.assign(view.tensor.shape,
                        view.tensor.shape + view.tensor.rank);
  auto *managed = new DLManagedTensor{};
  DLTensor &dl = managed->dl_tensor;
  dl.data = view.tensor.data;
  dl.device = view.tensor.backend == MTRT_BACKEND_CUDA
                  ? DLDevice{kDLCUDA, view.tensor.device}
                  : DLDevice{kDLCPU, 0};
  dl.ndim = view.tensor.rank;
  dl.dtype = toDLDataType(view.tensor.dtype);
  dl.shape = context->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  managed->manager_ctx = context;
  managed->deleter = deleteExported;
  return py::capsule(managed, "dltensor", [](PyObject *capsule) {
    // Unconsumed capsules still own their tensor.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto *m = static_cast<DLManagedTensor *>(
          PyCapsule_GetPointer(capsule, "dltensor"));
      m->deleter(m);
    }
  });
}

class Session {
public:
  Session(const Bundle &bundle, const std::string &backend, int device,
          py::object communicatorObject, int threads, bool tf32, uint64_t seed,
          double lr, double minLr, const std::string &decayStyle,
          int64_t warmupIters, int64_t decayIters, double warmupInit,
          double weightDecay, double beta1, double beta2, double eps,
          double clipGrad, double lossScale, double initialLossScale,
          double minLossScale, int64_t lossScaleWindow, int64_t hysteresis) {
    Communicator *communicator =
        communicatorObject.is_none() ? nullptr
                                     : communicatorObject.cast<Communicator *>();
    mtrt_session_options_t o;
    mtrt_session_options_initialize(&o);
    if (backend == "host")
      o.backend = MTRT_BACKEND_HOST;
    else if (backend == "cuda")
      o.backend = MTRT_BACKEND_CUDA;
    else
      invalid("backend: found '" + backend + "', expected 'host' or 'cuda'");
    if (decayStyle == "constant")
      o.lr_decay_style = MTRT_LR_DECAY_CONSTANT;
    else if (decayStyle == "linear")
      o.lr_decay_style = MTRT_LR_DECAY_LINEAR;
    else if (decayStyle == "cosine")
      o.lr_decay_style = MTRT_LR_DECAY_COSINE;
    else
      invalid("lr_decay_style: found '" + decayStyle +
              "', expected 'constant', 'linear' or 'cosine'");
    o.device = device;
    o.communicator = communicator ? communicator->handle.get() : nullptr;
    o.threads = threads;
    o.tf32 = tf32;
    o.seed = seed;
    o.lr = lr;
    o.min_lr = minLr;
    o.lr_warmup_iters = warmupIters;
    o.lr_decay_iters = decayIters;
    o.lr_warmup_init = warmupInit;
    o.weight_decay = weightDecay;
    o.adam_beta1 = beta1;
    o.adam_beta2 = beta2;
    o.adam_eps = eps;
    o.clip_grad = clipGrad;
    o.loss_scale = lossScale;
    o.initial_loss_scale = initialLossScale;
    o.min_loss_scale = minLossScale;
    o.loss_scale_window = lossScaleWindow;
    o.hysteresis = hysteresis;
    mtrt_session_t session = nullptr;
    callReleased([&] {
      return mtrt_session_create(bundle.handle.get(), &o, &session);
    });
    handle_.reset(session);
    communicator_ = std::move(communicatorObject);
  }

  py::tuple batchShape() const {
    int64_t rows = 0, cols = 0;
    mtrt_dtype_t dtype;
    check(mtrt_session_batch_info(handle_.get(), &rows, &cols, &dtype));
    return py::make_tuple(rows, cols);
  }
  std::string batchDtype() const {
    int64_t rows = 0, cols = 0;
    mtrt_dtype_t dtype;
    check(mtrt_session_batch_info(handle_.get(), &rows, &cols, &dtype));
    return dtype == MTRT_DTYPE_I64 ? "int64" : "int32";
  }

  /// The stream a producer of a CUDA batch orders its writes before (an
  /// int for __dlpack__), or None for a host session.
  py::object producerStream() const {
    void *stream = nullptr;
    mtrt_status_t status = mtrt_session_cuda_stream(handle_.get(), &stream);
    if (status) {
      mtrt_status_free(status);
      return py::none();
    }
    return py::int_(reinterpret_cast<uintptr_t>(stream));
  }

  void setBatch(py::handle tokens, py::handle labels, bool copy) {
    py::object stream = producerStream();
    auto t = takeTensor(tokens, "tokens", stream);
    auto l = takeTensor(labels, "labels", stream);
    callReleased([&] {
      return mtrt_session_set_batch(handle_.get(), &t->tensor, &l->tensor,
                                    copy ? MTRT_BATCH_COPY : MTRT_BATCH_BIND);
    });
    if (copy) {
      boundTokens_.reset();
      boundLabels_.reset();
    } else {
      boundTokens_ = std::move(t);
      boundLabels_ = std::move(l);
    }
  }

  py::dict trainStep() {
    mtrt_step_metrics_t m{};
    m.struct_size = sizeof(m);
    callReleased([&] { return mtrt_session_train_step(handle_.get(), &m); });
    return metricsDict(m);
  }
  double accumulate() {
    double loss = 0;
    callReleased([&] { return mtrt_session_accumulate(handle_.get(), &loss); });
    return loss;
  }
  py::dict apply() {
    mtrt_step_metrics_t m{};
    m.struct_size = sizeof(m);
    callReleased([&] { return mtrt_session_apply(handle_.get(), &m); });
    return metricsDict(m);
  }
  double evalStep() {
    double loss = 0;
    callReleased([&] { return mtrt_session_eval_step(handle_.get(), &loss); });
    return loss;
  }
  py::dict metrics() const {
    mtrt_step_metrics_t m{};
    m.struct_size = sizeof(m);
    check(mtrt_session_metrics(handle_.get(), &m));
    return metricsDict(m);
  }

  std::vector<std::string> parameterNames() const {
    size_t count = 0;
    check(mtrt_session_parameter_count(handle_.get(), &count));
    std::vector<std::string> names;
    for (size_t i = 0; i < count; ++i) {
      const char *name = nullptr;
      check(mtrt_session_parameter_name(handle_.get(), i, &name));
      names.emplace_back(name);
    }
    return names;
  }
  py::tuple parameterShape(const std::string &name) const {
    mtrt_tensor_t info;
    check(mtrt_session_parameter_info(handle_.get(), name.c_str(), &info));
    py::tuple shape(info.rank);
    for (int d = 0; d < info.rank; ++d)
      shape[d] = info.shape[d];
    return shape;
  }
  ParameterView parameter(py::object self, const std::string &name) const {
    ParameterView view;
    check(mtrt_session_parameter_view(handle_.get(), name.c_str(),
                                      &view.tensor));
    view.session = std::move(self);
    view.name = name;
    return view;
  }
  void getParameter(const std::string &name, py::handle destination) {
    auto d = takeTensor(destination, "destination", py::none());
    callReleased([&] {
      return mtrt_session_parameter_get(handle_.get(), name.c_str(),
                                        &d->tensor);
    });
  }
  void setParameter(const std::string &name, py::handle source) {
    auto s = takeTensor(source, "source", producerStream());
    callReleased([&] {
      return mtrt_session_parameter_set(handle_.get(), name.c_str(),
                                        &s->tensor);
    });
  }
  void saveCheckpoint(const std::string &directory) {
    callReleased([&] {
      return mtrt_session_save_checkpoint(handle_.get(), directory.c_str());
    });
  }
  void loadCheckpoint(const std::string &directory) {
    callReleased([&] {
      return mtrt_session_load_checkpoint(handle_.get(), directory.c_str());
    });
  }
  py::object cudaStream() const { return producerStream(); }

private:
  struct Release {
    void operator()(mtrt_session_t s) const { mtrt_session_release(s); }
  };
  std::unique_ptr<mtrt_session_s, Release> handle_;
  // Bound batches stay alive (and consumed DLPack tensors undeleted) until
  // replaced; the session's communicator until the session is gone. Members
  // are destroyed in reverse order: the session first.
  std::unique_ptr<HeldTensor> boundTokens_, boundLabels_;
  py::object communicator_;

public:
  ~Session() { handle_.reset(); }
};

} // namespace

PYBIND11_MODULE(mtrt, m) {
  m.doc() = "The mtrt runtime's C API: load a compiled bundle, create a "
            "session, feed batches through DLPack, step, read metrics and "
            "parameters, save and load checkpoints.";
  errorType = py::reinterpret_borrow<py::object>(
      PyErr_NewExceptionWithDoc("mtrt.Error",
                                "An mtrt status: `code` is its name "
                                "(INVALID_ARGUMENT, NOT_FOUND, ...).",
                                PyExc_RuntimeError, nullptr));
  m.attr("Error") = errorType;
  m.attr("__version__") = mtrt_version_string();
  m.attr("HEADER_VERSION") = py::make_tuple(
      MTRT_VERSION_MAJOR, MTRT_VERSION_MINOR, MTRT_VERSION_PATCH);
  m.def(
      "version",
      [] {
        mtrt_version_t v = mtrt_version();
        return py::make_tuple(v.major, v.minor, v.patch);
      },
      "The loaded library's version as (major, minor, patch).");

  py::class_<Bundle>(m, "Bundle", "A compiled bundle, validated on load.")
      .def(py::init<const std::string &>(), py::arg("path"))
      .def_property_readonly(
          "name", [](const Bundle &b) { return mtrt_bundle_name(b.handle.get()); })
      .def_property_readonly("rank_count", [](const Bundle &b) {
        int count = 0;
        check(mtrt_bundle_rank_count(b.handle.get(), &count));
        return count;
      });

  py::class_<Communicator>(m, "Communicator",
                           "One rank's membership in a world of ranks.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size);
  m.def(
      "in_process_world",
      [](int size) {
        if (size < 1 || size > MTRT_MAX_IN_PROCESS_RANKS)
          invalid("size: found " + std::to_string(size) + ", expected 1 to " +
                  std::to_string(MTRT_MAX_IN_PROCESS_RANKS));
        std::vector<mtrt_communicator_t> raw(static_cast<size_t>(size));
        check(mtrt_communicator_create_in_process(size, raw.data()));
        std::vector<Communicator> list;
        for (mtrt_communicator_t c : raw) {
          list.emplace_back();
          list.back().handle.reset(c);
        }
        return list;
      },
      py::arg("size"),
      "Communicators of `size` in-process ranks, one per rank; each rank's "
      "session runs on its own thread.");

  py::class_<ParameterView>(m, "ParameterView",
                            "A session's parameter, without copy: pass it to "
                            "numpy.from_dlpack or torch.from_dlpack.")
      .def_readonly("name", &ParameterView::name)
      .def_property_readonly("shape",
                             [](const ParameterView &v) {
                               return std::vector<int64_t>(
                                   v.tensor.shape,
                                   v.tensor.shape + v.tensor.rank);
                             })
      // The data are ready when a session call returns, so `stream` needs
      // no wait; newer consumers' max_version, dl_device and copy are
      // answered with a DLPack 0.6 capsule of the data in place.
      .def("__dlpack__",
           [](py::object self, py::kwargs) {
             return exportView(self.cast<const ParameterView &>(), self);
           })
      .def("__dlpack_device__", [](const ParameterView &v) {
        // py::tuple on both sides: newer pybind11 types make_tuple's result
        // by its arguments.
        int device = v.tensor.backend == MTRT_BACKEND_CUDA ? v.tensor.device : 0;
        int type = v.tensor.backend == MTRT_BACKEND_CUDA
                       ? static_cast<int>(kDLCUDA)
                       : static_cast<int>(kDLCPU);
        return py::tuple(py::make_tuple(type, device));
      });

  py::class_<Session>(m, "Session",
                      "One rank of a bundle in training. Keyword arguments "
                      "follow mtrt_session_options_t (megatron-train's "
                      "flags).")
      .def(py::init<const Bundle &, const std::string &, int, py::object,
                    int, bool, uint64_t, double, double, const std::string &,
                    int64_t, int64_t, double, double, double, double, double,
                    double, double, double, double, int64_t, int64_t>(),
           py::arg("bundle"), py::kw_only(), py::arg("backend") = "host",
           py::arg("device") = 0, py::arg("communicator") = py::none(),
           py::arg("threads") = 0, py::arg("tf32") = false,
           py::arg("seed") = 1234, py::arg("lr") = 1e-4,
           py::arg("min_lr") = 0.0, py::arg("lr_decay_style") = "constant",
           py::arg("lr_warmup_iters") = 0, py::arg("lr_decay_iters") = 0,
           py::arg("lr_warmup_init") = 0.0, py::arg("weight_decay") = 0.01,
           py::arg("adam_beta1") = 0.9, py::arg("adam_beta2") = 0.95,
           py::arg("adam_eps") = 1e-8, py::arg("clip_grad") = 1.0,
           py::arg("loss_scale") = 0.0,
           py::arg("initial_loss_scale") = 4294967296.0,
           py::arg("min_loss_scale") = 1.0,
           py::arg("loss_scale_window") = 1000, py::arg("hysteresis") = 2)
      .def_property_readonly("batch_shape", &Session::batchShape)
      .def_property_readonly("batch_dtype", &Session::batchDtype)
      .def_property_readonly("cuda_stream", &Session::cudaStream)
      .def("set_batch", &Session::setBatch, py::arg("tokens"),
           py::arg("labels"), py::kw_only(), py::arg("copy") = true,
           "Sets the micro-batch: copied now (copy=True), or bound in place "
           "and read at each step (copy=False; a GPU batch stays on the "
           "GPU).")
      .def("train_step", &Session::trainStep,
           "accumulate() then apply(); returns the step's metrics.")
      .def("accumulate", &Session::accumulate,
           "Forward and backward on the batch, adding the gradients; "
           "returns the loss.")
      .def("apply", &Session::apply,
           "The optimizer step over the accumulated micro-batches.")
      .def("eval_step", &Session::evalStep)
      .def_property_readonly("metrics", &Session::metrics)
      .def("parameter_names", &Session::parameterNames)
      .def("parameter_shape", &Session::parameterShape, py::arg("name"))
      .def(
          "parameter",
          [](py::object self, const std::string &name) {
            return self.cast<Session &>().parameter(self, name);
          },
          py::arg("name"))
      .def("get_parameter", &Session::getParameter, py::arg("name"),
           py::arg("destination"))
      .def("set_parameter", &Session::setParameter, py::arg("name"),
           py::arg("source"))
      .def("save_checkpoint", &Session::saveCheckpoint, py::arg("directory"))
      .def("load_checkpoint", &Session::loadCheckpoint, py::arg("directory"));
}
