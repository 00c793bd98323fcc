// tfrun's shared-memory all-reduce exchange, native: the TensorFlow op TfrunShmAllReduce
// and a C entry point (tfrun_shm_all_reduce) for the same code.
//
// Why: the Python exchange runs as a tf.py_function, which costs a copy of the gradients
// back into a new tensor, the GIL and the Python calls on every step; this op reads its
// input tensor where it is and sums straight into its output tensor.
//
// The protocol is shm_allreduce.py's, byte for byte: the Python side sets the group up
// (sockets, memfds, mappings) and hands it over with tfrun_shm_register; an exchange is
// "write my header and values in my buffer's current half, barrier (one byte to rank 0,
// one back), check every header, sum every buffer in rank order". Built and loaded by
// tfrun/_native.py; nothing here opens, maps or closes anything.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

constexpr int64_t kHeaderBytes = 64;  // shm_allreduce._HEADER_BYTES

enum Kind { kOk = 0, kMismatch = 1, kLeft = 2, kTimeout = 3, kNotRegistered = 4 };

struct Group {
  int rank = 0;
  int size = 0;
  std::vector<const char*> maps;  // every task's buffer: two halves of kHeaderBytes + chunk
  std::vector<int> fds;           // per rank: the socket to it (rank 0: to every other)
  std::vector<std::string> names;
  int64_t stride = 0;
  int64_t chunk = 0;
  uint64_t exchanges = 0;
};

std::mutex group_mutex;
Group* group = nullptr;  // guarded by group_mutex

struct Result {
  Kind kind = kOk;
  std::string message;
};

std::string Prefix() { return "tfrun shared-memory all-reduce: "; }

Result Left(const Group& g, int peer, const std::string& received) {
  return {kLeft, Prefix() + g.names[peer] + " left the exchange (its process ended?) at exchange " +
                     std::to_string(g.exchanges) + "; " + g.names[g.rank] +
                     " stops too. Received: " + received};
}

Result TimedOut(const Group& g, double timeout) {
  char seconds[32];
  snprintf(seconds, sizeof(seconds), "%g", timeout);
  return {kTimeout, Prefix() + "exchange " + std::to_string(g.exchanges) +
                        " took longer than the --comm timeout of " + seconds + " s"};
}

// Waits for `events` on fd: 1 ready, 0 timed out (timeout <= 0: wait for ever).
int WaitFor(int fd, short events, double timeout) {
  struct pollfd p = {fd, events, 0};
  int ms = timeout > 0 ? static_cast<int>(timeout * 1000) + 1 : -1;
  for (;;) {
    int n = poll(&p, 1, ms);
    if (n >= 0) return n > 0 ? 1 : 0;
    if (errno != EINTR) return 1;  // let recv/send report it
  }
}

Result Expect(const Group& g, int peer, char want, double timeout) {
  int fd = g.fds[peer];
  for (;;) {
    if (WaitFor(fd, POLLIN, timeout) == 0) return TimedOut(g, timeout);
    char got = 0;
    ssize_t n = recv(fd, &got, 1, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n == 1 && got == want) return {};
    return Left(g, peer, n == 1 ? std::string("b'") + got + "'" : "b''");
  }
}

Result Send(const Group& g, int peer, char byte, double timeout) {
  int fd = g.fds[peer];
  for (;;) {
    ssize_t n = send(fd, &byte, 1, MSG_NOSIGNAL);
    if (n == 1) return {};
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, timeout) == 0) return TimedOut(g, timeout);
      continue;
    }
    return Left(g, peer, "b''");
  }
}

Result Barrier(const Group& g, double timeout) {
  if (g.rank == 0) {
    for (int peer = 1; peer < g.size; ++peer) {
      Result r = Expect(g, peer, 'A', timeout);
      if (r.kind != kOk) return r;
    }
    for (int peer = 1; peer < g.size; ++peer) {
      Result r = Send(g, peer, 'G', timeout);
      if (r.kind != kOk) return r;
    }
    return {};
  }
  Result r = Send(g, 0, 'A', timeout);
  return r.kind != kOk ? r : Expect(g, 0, 'G', timeout);
}

template <typename T>
void Sum(const std::vector<const char*>& views, char* out, int64_t bytes) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(T));
  T* total = reinterpret_cast<T*>(out);
  const T* a = reinterpret_cast<const T*>(views[0]);
  const T* b = reinterpret_cast<const T*>(views[1]);
  for (int64_t i = 0; i < n; ++i) total[i] = a[i] + b[i];
  for (size_t r = 2; r < views.size(); ++r) {  // rank order: every task gets the same bits
    const T* v = reinterpret_cast<const T*>(views[r]);
    for (int64_t i = 0; i < n; ++i) total[i] = total[i] + v[i];
  }
}

// dtype codes shared with _native.py: 0 float16, 1 bfloat16, 2 float32, 3 float64.
bool SumAs(int dtype, const std::vector<const char*>& views, char* out, int64_t bytes) {
  switch (dtype) {
    case 0: Sum<Eigen::half>(views, out, bytes); return true;
    case 1: Sum<Eigen::bfloat16>(views, out, bytes); return true;
    case 2: Sum<float>(views, out, bytes); return true;
    case 3: Sum<double>(views, out, bytes); return true;
  }
  return false;
}

Result Exchange(Group& g, const char* mine, char* result, int64_t bytes, int dtype,
                double timeout) {
  const int64_t offset = static_cast<int64_t>(g.exchanges % 2) * g.stride;
  g.exchanges += 1;
  char* own = const_cast<char*>(g.maps[g.rank]) + offset;
  const uint64_t header[2] = {g.exchanges, static_cast<uint64_t>(bytes)};  // "<QQ"
  std::memcpy(own, header, sizeof(header));
  if (bytes > 0) std::memcpy(own + kHeaderBytes, mine, bytes);
  Result r = Barrier(g, timeout);
  if (r.kind != kOk) return r;
  std::vector<const char*> views;
  for (int rank = 0; rank < g.size; ++rank) {
    uint64_t theirs[2];
    std::memcpy(theirs, g.maps[rank] + offset, sizeof(theirs));
    if (theirs[0] != header[0] || theirs[1] != header[1]) {
      return {kMismatch,
              Prefix() + g.names[rank] + " is at exchange " + std::to_string(theirs[0]) + " of " +
                  std::to_string(theirs[1]) + " bytes, this task (" + g.names[g.rank] +
                  ") at exchange " + std::to_string(header[0]) + " of " +
                  std::to_string(header[1]) +
                  " bytes: the workers are not running the same all-reduces (does the script "
                  "build a different model on some worker?). Run with --comm ring to use "
                  "TensorFlow's collectives"};
    }
    views.push_back(g.maps[rank] + offset + kHeaderBytes);
  }
  if (!SumAs(dtype, views, result, bytes)) return {kMismatch, Prefix() + "unknown dtype code"};
  return {};
}

int ItemSize(int dtype) { return dtype <= 1 ? 2 : dtype == 2 ? 4 : 8; }

Result AllReduce(const char* in, char* out, int64_t bytes, int dtype, double timeout) {
  std::lock_guard<std::mutex> lock(group_mutex);
  if (group == nullptr) return {kNotRegistered, Prefix() + "no exchange is registered"};
  const int64_t item = ItemSize(dtype);
  const int64_t step = group->chunk - group->chunk % item;
  int64_t start = 0;
  do {  // like the Python exchange: an empty tensor still takes one (empty) exchange
    const int64_t length = std::min(step, bytes - start);
    Result r = Exchange(*group, in + start, out + start, length, dtype, timeout);
    if (r.kind != kOk) return r;
    start += step;
  } while (start < bytes);
  return {};
}

}  // namespace

extern "C" {

// Hands this process's connected group to the native exchange (replacing any earlier one).
// maps: size pointers; fds: size sockets (-1 where none); names: size '\n'-separated names.
int tfrun_shm_register(int rank, int size, const char* const* maps, int64_t stride,
                       int64_t chunk, const int* fds, const char* names,
                       uint64_t exchanges) {
  Group* g = new Group;
  g->rank = rank;
  g->size = size;
  g->stride = stride;
  g->chunk = chunk;
  g->exchanges = exchanges;
  std::string all(names);
  size_t start = 0;
  for (int r = 0; r < size; ++r) {
    g->maps.push_back(maps[r]);
    g->fds.push_back(fds[r]);
    size_t end = all.find('\n', start);
    g->names.push_back(all.substr(start, end == std::string::npos ? end : end - start));
    start = end == std::string::npos ? all.size() : end + 1;
  }
  std::lock_guard<std::mutex> lock(group_mutex);
  delete group;
  group = g;
  return 0;
}

// Forgets the group (before its mappings go); returns its exchange count.
uint64_t tfrun_shm_unregister() {
  std::lock_guard<std::mutex> lock(group_mutex);
  uint64_t exchanges = group == nullptr ? 0 : group->exchanges;
  delete group;
  group = nullptr;
  return exchanges;
}

// The all-reduce of `bytes` bytes of `dtype` values at `in` into `out` (may not overlap).
// Returns a Kind; the message goes into error (error_size bytes, NUL-terminated).
int tfrun_shm_all_reduce(const void* in, void* out, int64_t bytes, int dtype, double timeout,
                         char* error, int error_size) {
  Result r = AllReduce(static_cast<const char*>(in), static_cast<char*>(out), bytes, dtype,
                       timeout);
  if (error_size > 0) snprintf(error, error_size, "%s", r.message.c_str());
  return r.kind;
}

}  // extern "C"

namespace tensorflow {

REGISTER_OP("TfrunShmAllReduce")
    .Input("input: T")
    .Output("output: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("timeout_seconds: float = 0")
    .SetIsStateful()  // it talks to the other workers: never pruned, folded or merged
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

class TfrunShmAllReduceOp : public OpKernel {
 public:
  explicit TfrunShmAllReduceOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("timeout_seconds", &timeout_));
    DataType type;
    OP_REQUIRES_OK(context, context->GetAttr("T", &type));
    dtype_ = type == DT_HALF ? 0 : type == DT_BFLOAT16 ? 1 : type == DT_FLOAT ? 2 : 3;
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &output));
    const int64_t bytes = static_cast<int64_t>(input.TotalBytes());
    Result r = AllReduce(static_cast<const char*>(input.tensor_data().data()),
                         const_cast<char*>(output->tensor_data().data()), bytes, dtype_,
                         timeout_);
    switch (r.kind) {
      case kOk: return;
      case kTimeout: context->SetStatus(absl::DeadlineExceededError(r.message)); return;
      case kLeft: context->SetStatus(absl::UnavailableError(r.message)); return;
      default: context->SetStatus(absl::InternalError(r.message)); return;
    }
  }

 private:
  float timeout_ = 0;
  int dtype_ = 2;
};

REGISTER_KERNEL_BUILDER(Name("TfrunShmAllReduce").Device(DEVICE_CPU), TfrunShmAllReduceOp);

}  // namespace tensorflow
