// axon::comm: collectives between the processes of one host over shared memory
// (no PyTorch headers).  ProcessGroupAxon (csrc/distributed/) runs these as
// stream work on a communication stream; this library only moves and reduces
// bytes between raw pointers.  What the process group decides before it
// creates a group (AXON_COMM_* sizes, segment names, removal of segments left
// by dead processes) is in axon/comm_config.h.
//
// One ShmGroup per process group and process.  Rank 0 creates a POSIX
// shared-memory segment; the others open it by name; once every rank has
// attached, rank 0 unlinks the name, so nothing is left in /dev/shm even if a
// process later crashes.  The segment holds, per rank, a control block
// (progress counter, pid), two double-buffered "slots" (data and result) and,
// per ordered pair of ranks, a ring buffer for send/recv.
//
// Collectives are sequences of steps.  In step s a rank writes into its slot
// s % 2, publishes "written" (phase 3s+1), waits for every peer's phase,
// reads the peers' slots, optionally publishes a second phase (3s+2) and
// finishes with "done reading" (3s+3).  A slot is rewritten two steps later,
// after every peer's 3(s-2)+3: two buffers and three phases make a trailing
// barrier unnecessary (DeepSpeed's shm allreduce does the same).
//
// Every call carries a signature (a sequence number, the kind of call, the
// dtype, the element or byte count, the reduce op and the root), written to
// the rank's control block in the call's first step; in that step every rank
// waits for every peer's first phase and compares the signatures before it
// reads or writes any peer's data.  A mismatch fails the call on every rank
// with a message naming both calls, and the group is broken.  Point-to-point
// messages carry their byte count and dtype, checked by the receiver.
//
// Waits spin briefly, then yield, then sleep on a futex in the segment: on
// machines with fewer cores than ranks a spinning rank would steal the core
// its peer needs.  A wait that passes the timeout, or whose peer process has
// exited or destroyed its ShmGroup (a rank that made fewer calls), throws
// CommError naming the operation and the missing ranks; the group is then
// broken and every later call throws at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace axon::comm {

class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

enum class DType : int { kFloat32, kFloat64, kFloat16, kBFloat16, kInt8, kUInt8,
                         kInt16, kInt32, kInt64, kBool };
// kPremulSum: the sum times a factor (c10d's PREMUL_SUM), applied to the
// float accumulator after summing.
enum class ReduceOp : int { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor, kPremulSum };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
const char* reduce_op_name(ReduceOp op);
// Throws CommError if op is not defined for dt (avg of integers, bitwise ops of floats).
void check_reduce(DType dt, ReduceOp op);

// out[i] = srcs[0][i] op srcs[1][i] op ... (in that order, so every rank that
// reduces the same inputs gets the same bits); bfloat16/float16 accumulate in
// float32.  kAvg divides the sum by nsrc.  out may alias srcs[k].
void reduce(DType dt, ReduceOp op, void* out, const void* const* srcs, int nsrc, size_t count,
            double factor = 1.0);

struct Config {
  size_t slot_bytes = size_t{4} << 20;    // per rank and buffer (x2 buffers, x2 data/result)
  size_t p2p_bytes = size_t{1} << 20;     // ring buffer per ordered pair of ranks
  size_t small_bytes = size_t{256} << 10; // all_reduce up to this: every rank reduces all inputs
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // The cache of mapped peer buffers (see ShmGroup::map_peer) holds at most
  // this many mappings and bytes; the least recently used go first.
  size_t peer_map_entries = 256;
  size_t peer_map_bytes = size_t{4} << 30;
};

// A buffer other processes can map: its memfd (valid in the owning process),
// an id unique among the owner's buffers, the mapping's size and the
// buffer's offset in it (the runtime's MemoryExport of device memory).
// Peers cache their mapping of it by (rank, id).  The owner releases the
// memory with ftruncate(fd, 0) before closing fd (axon::rt::free does): that
// frees the pages even while peers still map them, and tells the peers'
// caches that the mapping is stale (they drop it at their next shared step).
// Ids are never reused, so a stale mapping is never read.
struct SharedBuffer {
  int fd = -1;
  uint64_t id = 0;
  size_t size = 0;
  size_t offset = 0;
};

// A send or receive of a batch (send_recv_batch).
struct P2POp {
  bool send;
  int peer;
  void* data;    // const for sends
  size_t bytes;
  int dtype = -1;  // a DType the receiver checks against the sender's, or -1 (unchecked)
};

class ShmGroup {
 public:
  // Rank 0 creates the segment `name` (a POSIX shm name without the leading
  // slash); other ranks open it (retrying until it exists or the timeout).
  // Returns once this rank has attached; attach_all() waits for the others.
  ShmGroup(const std::string& name, int rank, int size, const Config& config);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Waits until every rank has attached; rank 0 then unlinks the name.
  void attach_all();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }
  void set_timeout(std::chrono::milliseconds t) { config_.timeout = t; }
  // Non-empty once an operation has failed here or any rank aborted the
  // group: it is unusable.  Safe to call from any thread.
  std::string broken() const;
  // Marks the group failed (here and, through the segment, for every peer:
  // their waits fail at once instead of at the timeout).  For failures
  // outside this class (e.g. a gloo transfer between hosts).
  void abort(const std::string& why);
  // The element type that the next byte-moving collectives (broadcast,
  // all_gather, gather, scatter) carry in their signature, or -1; reducing
  // collectives carry their own.  Stays until changed.
  void set_dtype_tag(int dtype) { dtype_tag_ = dtype; }
  // The memory layout of the next collectives' data, carried in their
  // signature so that ranks whose tensors lay the same elements out
  // differently (channels_last against contiguous) fail instead of mixing
  // elements: 0 row-major, -1 not compared, else layout_tag() of the
  // dimensions' memory order.  Stays until changed.
  void set_layout_tag(int32_t layout) { layout_tag_ = layout; }
  // The tag of a layout whose dimensions, outermost first, are order[0..n)
  // (n <= 7; -1 otherwise).
  static int32_t layout_tag(const int* order, int n);
  // "contiguous", "channels_last", "strided, memory order (0, 2, 1)"; "" for -1.
  static std::string layout_name(int32_t tag);
  // The peers' buffers mapped here (the cache of map_peer): count and bytes.
  size_t mapped_peer_count() const { return peer_maps_.size(); }
  size_t mapped_peer_bytes() const;

  void barrier();
  // In place: data holds this rank's input and receives the result.  When
  // every rank passes `shared` (its data is in mappable memory), a large
  // all_reduce reads and writes the peers' buffers directly (no staging);
  // ranks may differ in passing it (then all stage).
  void all_reduce(void* data, size_t count, DType dt, ReduceOp op, double factor = 1.0,
                  const SharedBuffer* shared = nullptr);
  // With every rank's data shared, a large broadcast between 2 ranks copies
  // from the root's buffer directly (one copy instead of two).
  void broadcast(void* data, size_t bytes, int root, const SharedBuffer* shared = nullptr);
  // The result lands in data on root only; other ranks' data is unchanged.
  void reduce(void* data, size_t count, DType dt, ReduceOp op, int root, double factor = 1.0);
  // outputs[r] receives rank r's `bytes` bytes of input (outputs[rank] may be input).
  // With every rank's input shared, a large one copies from the peers directly.
  void all_gather(const void* input, size_t bytes, void* const* outputs,
                  const SharedBuffer* shared = nullptr);
  // gather: like all_gather, but only root's outputs are written (others may pass null).
  void gather(const void* input, size_t bytes, void* const* outputs, int root);
  // scatter: rank r receives root's inputs[r] (only root's inputs are read).
  void scatter(const void* const* inputs, size_t bytes, void* output, int root);
  // inputs[r] is this rank's contribution to rank r (count elements each);
  // output receives the reduction over ranks of their inputs[rank].
  // inputs_shared: the inputs lie one after another (inputs[r] = inputs[0] +
  // r * count elements) in this shared buffer; with every rank's, a large one
  // reads the peers' inputs directly.
  void reduce_scatter(const void* const* inputs, void* output, size_t count, DType dt,
                      ReduceOp op, double factor = 1.0,
                      const SharedBuffer* inputs_shared = nullptr);
  // inputs[r] (send_bytes[r]) goes to rank r, arriving in its outputs[rank];
  // recv_bytes[r] must equal what rank r sends here.
  // inputs_shared: the inputs lie one after another from inputs[0] (inputs[r]
  // = inputs[0] + send_bytes[0] + ... + send_bytes[r - 1]) in this shared
  // buffer; with every rank's, a large one copies from the peers' inputs
  // directly (one copy instead of two).  No output may overlap the inputs
  // (on any path: the staged one would overwrite parts not yet sent).
  void all_to_all(const void* const* inputs, const size_t* send_bytes, void* const* outputs,
                  const size_t* recv_bytes, const SharedBuffer* inputs_shared = nullptr);
  // Point to point: messages between a pair arrive in order.  A batch makes
  // progress on all its operations at once, so a batch in which both ranks of
  // a pair send first cannot deadlock.
  void send(const void* data, size_t bytes, int peer);
  void recv(void* data, size_t bytes, int peer);
  void send_recv_batch(const std::vector<P2POp>& ops);


 private:
  struct Header;
  struct RankCtl;
  struct Chan;

  enum class Kind : uint32_t { kNone, kBarrier, kAllReduce, kBroadcast, kReduce, kAllGather,
                              kGather, kScatter, kReduceScatter, kAllToAll };
  // A call's signature (in the control block: trivially copyable).
  struct Sig {
    uint64_t seq;
    uint32_t kind;
    int32_t dtype;   // a DType, or -1
    uint64_t count;  // elements (reducing calls) or bytes
    int32_t op;      // a ReduceOp, or -1
    int32_t root;    // or -1
    int32_t layout;  // set_layout_tag's, or -1
  };
  struct PeerMap {
    void* addr;
    size_t size;
    int fd;              // this process's descriptor of the peer's memfd
    uint64_t last_used;  // the step that last used it
  };
  void check_usable(const char* op);
  // Starts a call: its signature goes out with the first step's phase 1.
  void begin_call(Kind kind, int dtype, uint64_t count, int op, int root);
  void check_signatures();
  std::string describe(const Sig& s, bool layout = false) const;  // layout: name it
  void sweep_peer_maps(size_t incoming_entries, size_t incoming_bytes);
  std::string peer_abort_message() const;  // empty unless another rank aborted
  [[noreturn]] void fail(const std::string& message);
  // Step protocol.
  void begin_step(const char* op);
  void publish(int k);
  void wait_peers(int k, const char* op, int only_rank = -1);
  char* data_slot(int r) const;
  char* result_slot(int r) const;
  void ring();
  template <typename Ready>
  void wait_for(Ready&& ready, const char* op,
                const std::function<std::vector<int>()>& waiting_for, const std::string& what);
  bool peer_alive(int r) const;

  void all_reduce_small(char* data, size_t count, DType dt, ReduceOp op, double factor);
  void gather_to(const void* input, size_t bytes, void* const* outputs, int root, const char* op);
  void all_reduce_large(char* data, size_t count, DType dt, ReduceOp op, double factor);
  bool all_reduce_shared(char* data, size_t count, DType dt, ReduceOp op, double factor,
                         const SharedBuffer* shared);
  bool map_all(const char* op, const SharedBuffer* shared, char* mine, std::vector<char*>& bufs);
  void finish_shared(const char* op);
  char* map_peer(int r, int fd, uint64_t id, size_t size);

  Chan& chan(int from, int to) const;
  char* chan_buf(int from, int to) const;

  std::string name_;
  int rank_, size_;
  Config config_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  size_t chan_off_ = 0, slots_off_ = 0, p2p_off_ = 0;  // offsets of the layout's parts
  bool unlinked_ = false;
  Header* header_ = nullptr;
  RankCtl* ctl_ = nullptr;
  uint64_t step_ = 0;     // steps started by this rank
  uint64_t cur_ = 0;      // the current step
  const char* cur_op_ = "";
  std::map<std::pair<int, uint64_t>, PeerMap> peer_maps_;  // (rank, id)
  size_t peer_map_bytes_ = 0;
  uint64_t calls_ = 0;                 // calls started by this rank (their sequence number)
  bool sig_pending_ = false;           // the next step carries the call's signature
  Sig sig_{};                          // the current call's
  uint64_t sig_step_ = UINT64_MAX;     // the step whose phase 1 compares signatures
  int dtype_tag_ = -1;
  int32_t layout_tag_ = -1;
  mutable std::mutex broken_mu_;
  std::string broken_;
};

// The bytes/second of a single-threaded memcpy of `bytes` (median of reps): the
// physical reference of the collective benchmarks.
double memcpy_bandwidth(size_t bytes, int reps);

}  // namespace axon::comm
