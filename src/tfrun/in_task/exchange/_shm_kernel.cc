// tfrun's shared-memory all-reduce exchange, native: the TensorFlow op TfrunShmAllReduce
// and a C entry point (tfrun_shm_all_reduce) for the same code. Also the TCP exchange's
// owner sum of 16-bit values (tfrun_sum_16, for --comm compress=fp16|bf16).
//
// Why: the Python exchange runs as a tf.py_function, which costs a copy of the gradients
// back into a new tensor, the GIL and the Python calls on every step; this op reads its
// input tensors where they are and sums straight into its output tensors. It takes a whole
// pack of gradients as a list: the exchange sees their concatenation, which TensorFlow's
// batch_all_reduce would have made with a ConcatV2 and taken apart with a SplitV (two more
// copies of every gradient per step), without making it.
//
// The protocol is shm_allreduce.py's, byte for byte: the Python side sets the group up
// (sockets, memfds, mappings) and hands it over with tfrun_shm_register; an exchange is
// "write my header and values in my buffer's current half, barrier (one byte to rank 0,
// one back), check every header, sum every buffer in rank order". Built and loaded by
// tfrun/_native.py; nothing here opens, maps or closes anything.
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86_INTRINSICS 1  // F16C, if the CPU has it (checked at run time)
#endif

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
  double spin = 0;  // seconds a barrier polls its socket before it sleeps in poll()
};

std::mutex group_mutex;
// All-reduces this process's op has entered and left: the evidence of who never arrived at
// a collective, sampled by tfrun.in_task.exchange.arrivals (lock-free: a sample never waits).
std::atomic<uint64_t> op_entered{0}, op_left{0};
// ... and the nanoseconds spent inside them: what the others wait for a straggler.
std::atomic<uint64_t> op_inside_ns{0};
std::atomic<bool> counting{true};  // off with the run's recording (nobody reads the counts)
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

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Result Expect(const Group& g, int peer, char want, double timeout) {
  int fd = g.fds[peer];
  // Poll first, for g.spin seconds (with sched_yield, so this task's other threads on this
  // CPU still run), then sleep in poll(): a worker that sleeps waits for the scheduler --
  // on a VM, for the hypervisor to wake its idle vCPU -- every time its peer is a little
  // late, twice per step.
  const double until = Seconds() + (timeout > 0 ? std::min(g.spin, timeout) : g.spin);
  for (;;) {
    char got = 0;
    ssize_t n = recv(fd, &got, 1, MSG_DONTWAIT);
    if (n == 1 && got == want) return {};
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return Left(g, peer, n == 1 ? std::string("b'") + got + "'" : "b''");
    }
    if (Seconds() < until) {
      sched_yield();
    } else if (WaitFor(fd, POLLIN, timeout) == 0) {
      return TimedOut(g, timeout);
    }
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

// --- The owner sum of 16-bit values (compression.sum_on_wire's, in one pass) ---------------
// NumPy and TensorFlow's eager casts take three passes and three temporary arrays over the
// owner's slice (up, add, down) on the core backprop uses; this reads each part once.

inline float HalfToFloat(uint16_t bits) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
}

inline uint16_t FloatToHalf(float value) {  // nearest, ties to even (as TensorFlow's cast)
  return Eigen::numext::bit_cast<uint16_t>(Eigen::half(value));
}

inline float Bfloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

inline uint16_t FloatToBfloat16(float value) {  // compression.down's rounding, bit for bit
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  // NaN: no payload carried into inf (a select, not a branch: the loop stays vectorized)
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

// In blocks that stay in the cache, each loop simple enough for the compiler to vectorize;
// every value is still summed in rank order.
template <float (*Up)(uint16_t), uint16_t (*Down)(float)>
void SumScalar(int count, const uint16_t* const* parts, int64_t start, int64_t n,
               uint16_t* out) {
  constexpr int64_t kBlock = 2048;
  float total[kBlock];
  for (int64_t begin = start; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    const uint16_t* first = parts[0] + begin;
    for (int64_t j = 0; j < m; ++j) total[j] = Up(first[j]);
    for (int r = 1; r < count; ++r) {
      const uint16_t* part = parts[r] + begin;
      for (int64_t j = 0; j < m; ++j) total[j] += Up(part[j]);
    }
    for (int64_t j = 0; j < m; ++j) out[begin + j] = Down(total[j]);
  }
}

#ifdef HAVE_X86_INTRINSICS
// IEEE half with the F16C conversions, 8 values at a time; the rounding is the same
// (nearest, ties to even), so are the bits. Returns where the scalar tail starts.
__attribute__((target("avx,f16c"))) int64_t SumHalfF16c(int count,
                                                        const uint16_t* const* parts,
                                                        int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 total = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(parts[0] + i)));
    for (int r = 1; r < count; ++r) {
      total = _mm256_add_ps(total, _mm256_cvtph_ps(_mm_loadu_si128(
                                       reinterpret_cast<const __m128i*>(parts[r] + i))));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(total, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
#endif

int ItemSize(int dtype) { return dtype <= 1 ? 2 : dtype == 2 ? 4 : 8; }

// The tensors of one all-reduce, in order: the exchange moves their concatenation.
struct Pieces {
  std::vector<const char*> in;
  std::vector<char*> out;
  std::vector<int64_t> bytes;
};

// Calls part(piece, offset in the piece, offset from start, bytes) for every piece's share
// of the concatenation's bytes [start, start + length).
template <typename Part>
void ForEachPart(const Pieces& pieces, int64_t start, int64_t length, Part part) {
  int64_t base = 0;
  for (size_t i = 0; i < pieces.bytes.size() && base < start + length; ++i) {
    const int64_t from = std::max(start, base);
    const int64_t to = std::min(start + length, base + pieces.bytes[i]);
    if (from < to) part(i, from - base, from - start, to - from);
    base += pieces.bytes[i];
  }
}

Result Exchange(Group& g, const Pieces& pieces, int64_t start, int64_t bytes, int dtype,
                double timeout) {
  const int64_t offset = static_cast<int64_t>(g.exchanges % 2) * g.stride;
  g.exchanges += 1;
  char* own = const_cast<char*>(g.maps[g.rank]) + offset;
  const uint64_t header[2] = {g.exchanges, static_cast<uint64_t>(bytes)};  // "<QQ"
  std::memcpy(own, header, sizeof(header));
  ForEachPart(pieces, start, bytes, [&](size_t i, int64_t at, int64_t to, int64_t n) {
    std::memcpy(own + kHeaderBytes + to, pieces.in[i] + at, n);
  });
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
  bool known = true;
  ForEachPart(pieces, start, bytes, [&](size_t i, int64_t at, int64_t to, int64_t n) {
    std::vector<const char*> parts;
    for (int rank = 0; rank < g.size; ++rank) {
      // This task's own values are read from its input (the same bytes as its buffer's).
      parts.push_back(rank == g.rank ? pieces.in[i] + at : views[rank] + to);
    }
    known = known && SumAs(dtype, parts, pieces.out[i] + at, n);
  });
  if (!known) return {kMismatch, Prefix() + "unknown dtype code"};
  return {};
}

Result AllReduce(const Pieces& pieces, int dtype, double timeout) {
  std::lock_guard<std::mutex> lock(group_mutex);
  if (group == nullptr) return {kNotRegistered, Prefix() + "no exchange is registered"};
  const int64_t item = ItemSize(dtype);
  const int64_t step = group->chunk - group->chunk % item;
  int64_t total = 0;
  for (int64_t bytes : pieces.bytes) total += bytes;
  int64_t start = 0;
  do {  // like the Python exchange: an empty tensor still takes one (empty) exchange
    const int64_t length = std::min(step, total - start);
    Result r = Exchange(*group, pieces, start, length, dtype, timeout);
    if (r.kind != kOk) return r;
    start += step;
  } while (start < total);
  return {};
}

}  // namespace

extern "C" {

// Hands this process's connected group to the native exchange (replacing any earlier one).
// maps: size pointers; fds: size sockets (-1 where none); names: size '\n'-separated names;
// spin: seconds a barrier keeps polling before it sleeps (0: it sleeps at once).
int tfrun_shm_register(int rank, int size, const char* const* maps, int64_t stride,
                       int64_t chunk, const int* fds, const char* names,
                       uint64_t exchanges, double spin) {
  Group* g = new Group;
  g->rank = rank;
  g->size = size;
  g->stride = stride;
  g->chunk = chunk;
  g->exchanges = exchanges;
  g->spin = spin;
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

// The all-reduce of `count` arrays of `dtype` values (in[i]: bytes[i] bytes, summed into
// out[i], which may not overlap any input), exchanged as their concatenation.
// Returns a Kind; the message goes into error (error_size bytes, NUL-terminated).
int tfrun_shm_all_reduce(int count, const void* const* in, void* const* out,
                         const int64_t* bytes, int dtype, double timeout, char* error,
                         int error_size) {
  Pieces pieces;
  for (int i = 0; i < count; ++i) {
    pieces.in.push_back(static_cast<const char*>(in[i]));
    pieces.out.push_back(static_cast<char*>(out[i]));
    pieces.bytes.push_back(bytes[i]);
  }
  Result r = AllReduce(pieces, dtype, timeout);
  if (error_size > 0) snprintf(error, error_size, "%s", r.message.c_str());
  return r.kind;
}

// The sum as float32, in rank order, of `count` arrays of `n` 16-bit values (wire 0: IEEE
// half, 1: bfloat16), rounded to the same 16 bits into out (which may be one of the parts).
// Returns 0, or 1 for an unknown wire.
int tfrun_sum_16(int wire, int count, const void* const* parts, int64_t n, void* out) {
  const auto* const* values = reinterpret_cast<const uint16_t* const*>(parts);
  auto* sums = static_cast<uint16_t*>(out);
  if (wire == 0) {
    int64_t done = 0;
#ifdef HAVE_X86_INTRINSICS
    static const bool f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    if (f16c) done = SumHalfF16c(count, values, n, sums);
#endif
    SumScalar<HalfToFloat, FloatToHalf>(count, values, done, n, sums);
    return 0;
  }
  if (wire == 1) {
    SumScalar<Bfloat16ToFloat, FloatToBfloat16>(count, values, 0, n, sums);
    return 0;
  }
  return 1;
}

// Whether the op counts its all-reduces (on unless the run's recording is off).
void tfrun_shm_set_counting(int on) { counting.store(on != 0); }

// This process's position in the exchange: out[0] all-reduces entered, out[1] left,
// out[2] nanoseconds spent inside them.
void tfrun_shm_position(uint64_t* out) {
  out[0] = op_entered.load(std::memory_order_relaxed);
  out[1] = op_left.load(std::memory_order_relaxed);
  out[2] = op_inside_ns.load(std::memory_order_relaxed);
}

}  // extern "C"

namespace tensorflow {

REGISTER_OP("TfrunShmAllReduce")
    .Input("inputs: N * T")
    .Output("outputs: N * T")
    .Attr("N: int >= 1")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("timeout_seconds: float = 0")
    .SetIsStateful()  // it talks to the other workers: never pruned, folded or merged
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    });

// The sum over every worker of each input tensor, one exchange (or one per chunk) for all.
class TfrunShmAllReduceOp : public OpKernel {
 public:
  explicit TfrunShmAllReduceOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("timeout_seconds", &timeout_));
    DataType type;
    OP_REQUIRES_OK(context, context->GetAttr("T", &type));
    dtype_ = type == DT_HALF ? 0 : type == DT_BFLOAT16 ? 1 : type == DT_FLOAT ? 2 : 3;
  }

  void Compute(OpKernelContext* context) override {
    OpInputList inputs;
    OP_REQUIRES_OK(context, context->input_list("inputs", &inputs));
    OpOutputList outputs;
    OP_REQUIRES_OK(context, context->output_list("outputs", &outputs));
    Pieces pieces;
    for (int i = 0; i < inputs.size(); ++i) {
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context, outputs.allocate(i, inputs[i].shape(), &output));
      pieces.in.push_back(inputs[i].tensor_data().data());
      pieces.out.push_back(const_cast<char*>(output->tensor_data().data()));
      pieces.bytes.push_back(static_cast<int64_t>(inputs[i].TotalBytes()));
    }
    const bool count = counting.load(std::memory_order_relaxed);
    const auto entered = std::chrono::steady_clock::now();
    if (count) op_entered.fetch_add(1, std::memory_order_relaxed);
    Result r = AllReduce(pieces, dtype_, timeout_);
    if (count) {
      op_inside_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - entered).count(),
                             std::memory_order_relaxed);
      op_left.fetch_add(1, std::memory_order_relaxed);
    }
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
