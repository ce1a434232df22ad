#include "parallel/comm.h"

#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace mt::par {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string mpi_error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return cat("MPI error ", rc);
  return std::string(buf, static_cast<size_t>(len));
}

// Every MPI call goes through this so a failure names the call, the rank and the place.
#define MT_MPI(where, call)                                                                \
  do {                                                                                     \
    const int mt_rc_ = (call);                                                             \
    if (mt_rc_ != MPI_SUCCESS)                                                             \
      throw CommError(__FILE__, __LINE__,                                                  \
                      ::mt::cat(where, ": ", #call, " failed: ", mpi_error_text(mt_rc_))); \
  } while (0)

MPI_Datatype mpi_type(Elem e) {
  switch (e) {
    case Elem::F32:
      return MPI_FLOAT;
    case Elem::F64:
      return MPI_DOUBLE;
    case Elem::I32:
      return MPI_INT32_T;
    case Elem::I64:
      return MPI_INT64_T;
    case Elem::BF16:
      return MPI_UINT16_T;  // moved as words; summed by bf16_sum_op()
  }
  MT_THROW(InternalError, "unknown element type");
}

// bf16 addition for MPI reductions: each combine adds in fp32 and rounds back to bf16.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

// The sum of element type e. The bf16 op is created on first use (after MPI_Init) and lives until
// MPI_Finalize frees it.
MPI_Op sum_op(Elem e) {
  if (e != Elem::BF16) return MPI_SUM;
  static MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&bf16_sum, /*commute=*/1, &o);
    return o;
  }();
  MT_CHECK(op != MPI_OP_NULL, InternalError, "MPI_Op_create failed for the bf16 sum");
  return op;
}

int to_int(int64_t v, const char* what) {
  MT_CHECK(v >= 0 && v <= INT_MAX, ValueError, what, " ", v,
           " does not fit an MPI count (split the collective)");
  return static_cast<int>(v);
}

// Every world rank's process id and host, for naming the peers that died, and the injected kill.
struct Peers {
  std::vector<int64_t> pid;
  std::vector<uint64_t> host;  // FNV-1a of the host name
  uint64_t my_host = 0;
  int kill_rank = -1;
  int kill_signal = SIGKILL;  // SIGSTOP: the rank stops answering but stays alive
  int64_t kill_call = 0;
  std::string kill_in;
};

uint64_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return h;
}

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...), or 0 when there is none.
char proc_state(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  const size_t close = line.rfind(')');  // the command name may hold spaces
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 0;
}

// "; world rank 1 (pid 123) is dead" for every peer found gone, zombie or stopped.
std::string peer_report(const Peers& peers, int self) {
  std::string dead, stopped, unknown;
  for (size_t r = 0; r < peers.pid.size(); ++r) {
    if (static_cast<int>(r) == self) continue;
    if (peers.host[r] != peers.my_host) {
      unknown += cat(unknown.empty() ? "" : ", ", r);
      continue;
    }
    const char st = proc_state(peers.pid[r]);
    const std::string who = cat("world rank ", r, " (pid ", peers.pid[r], ")");
    if (st == 0 || st == 'Z' || st == 'X')
      dead += cat(dead.empty() ? "" : ", ", who);
    else if (st == 'T' || st == 't')
      stopped += cat(stopped.empty() ? "" : ", ", who);
  }
  std::string out;
  if (!dead.empty()) out += cat("; dead: ", dead);
  if (!stopped.empty()) out += cat("; stopped: ", stopped);
  if (dead.empty() && stopped.empty())
    out += "; every peer on this host is alive (a stalled peer, or one on another host)";
  if (!unknown.empty()) out += cat("; on other hosts, not checked: world ranks ", unknown);
  return out;
}

// One shared instance stands for every completed collective of a LocalComm.
class DoneImpl : public Request::Impl {
 public:
  void wait() override {}
  bool done() override { return true; }
  void recycle() override {}
};

class MpiComm;

class MpiRequest : public Request::Impl {
 public:
  MpiRequest(MpiComm& comm, Collective c, int64_t sent, int64_t recv)
      : comm_(comm), coll_(c), sent_(sent), recv_(recv) {}
  ~MpiRequest() override {
    // An abandoned request must not leave MPI writing into freed buffers. One that timed out is
    // left pending instead: waiting for it is the hang the timeout exists to prevent, and the
    // rank is about to abort the job (Comm::abort) anyway.
    if (req_ != MPI_REQUEST_NULL && !timed_out_) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  void wait() override;
  void recycle() override;
  void poll(int* flag);
  bool done() override {
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }

  // A request taken from the communicator's pool for the collective c.
  void reuse(Collective c, int64_t sent, int64_t recv) {
    coll_ = c;
    sent_ = sent;
    recv_ = recv;
  }

  MPI_Request req_ = MPI_REQUEST_NULL;
  bool timed_out_ = false;
  std::vector<int> counts_;  // all-to-all-v counts/displacements must outlive the request

 private:
  MpiComm& comm_;
  Collective coll_;
  int64_t sent_, recv_;
};

class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm comm, bool owned, std::string name, int world_rank, const CommOptions& opt,
          std::shared_ptr<const Peers> peers)
      : comm_(comm),
        owned_(owned),
        name_(std::move(name)),
        world_rank_(world_rank),
        opt_(opt),
        peers_(std::move(peers)) {
    MT_MPI(name_, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MT_MPI(name_, MPI_Comm_rank(comm_, &rank_));
    MT_MPI(name_, MPI_Comm_size(comm_, &size_));
  }
  ~MpiComm() override {
    if (owned_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string where() const override {
    if (name_ == "world") return cat("world rank ", rank_, "/", size_);
    return cat(name_, " rank ", rank_, "/", size_, " (world rank ", world_rank_, ")");
  }
  const CommOptions& options() const { return opt_; }
  void set_timeout(std::chrono::milliseconds t) override { opt_.timeout = t; }
  // What a failed wait adds to its message: the peers found dead or stopped.
  std::string peer_state() const { return peers_ ? peer_report(*peers_, world_rank_) : ""; }

  Request iall_reduce(void* data, int64_t count, Elem e) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto r = start(Collective::AllReduce, b, b);
    MT_MPI(where(), MPI_Iallreduce(MPI_IN_PLACE, data, to_int(count, "all_reduce count"),
                                   mpi_type(e), sum_op(e), comm_, &r->req_));
    return finish(Collective::AllReduce, std::move(r));
  }
  Request iall_gather(const void* send, int64_t count, void* recv, Elem e) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto r = start(Collective::AllGather, b, b * size_);
    const int n = to_int(count, "all_gather count");
    MT_MPI(where(), MPI_Iallgather(send, n, mpi_type(e), recv, n, mpi_type(e), comm_, &r->req_));
    return finish(Collective::AllGather, std::move(r));
  }
  Request ireduce_scatter(const void* send, void* recv, int64_t count, Elem e) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto r = start(Collective::ReduceScatter, b * size_, b);
    MT_MPI(where(), MPI_Ireduce_scatter_block(send, recv, to_int(count, "reduce_scatter count"),
                                              mpi_type(e), sum_op(e), comm_, &r->req_));
    return finish(Collective::ReduceScatter, std::move(r));
  }
  Request iall_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& send_displs, void* recv,
                        const std::vector<int64_t>& recv_counts,
                        const std::vector<int64_t>& recv_displs, Elem e) override {
    const size_t P = static_cast<size_t>(size_);
    check_peer_counts(send_counts, send_displs, recv_counts, recv_displs);
    int64_t sb = 0, rb = 0;
    for (size_t i = 0; i < P; ++i) {
      sb += send_counts[i];
      rb += recv_counts[i];
    }
    const int64_t es = static_cast<int64_t>(elem_size(e));
    auto r = start(Collective::AllToAllV, sb * es, rb * es);
    r->counts_.resize(4 * P);
    for (size_t i = 0; i < P; ++i) {
      r->counts_[i] = to_int(send_counts[i], "all_to_all_v send count");
      r->counts_[P + i] = to_int(send_displs[i], "all_to_all_v send displacement");
      r->counts_[2 * P + i] = to_int(recv_counts[i], "all_to_all_v recv count");
      r->counts_[3 * P + i] = to_int(recv_displs[i], "all_to_all_v recv displacement");
    }
    const int* c = r->counts_.data();
    MT_MPI(where(), MPI_Ialltoallv(send, c, c + P, mpi_type(e), recv, c + 2 * P, c + 3 * P,
                                   mpi_type(e), comm_, &r->req_));
    return finish(Collective::AllToAllV, std::move(r));
  }
  Request ibroadcast(void* data, int64_t count, Elem e, int root) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto r = start(Collective::Broadcast, rank_ == root ? b : 0, rank_ == root ? 0 : b);
    MT_MPI(where(),
           MPI_Ibcast(data, to_int(count, "broadcast count"), mpi_type(e), root, comm_, &r->req_));
    return finish(Collective::Broadcast, std::move(r));
  }
  void barrier() override {
    auto r = start(Collective::Barrier, 0, 0);
    MT_MPI(where(), MPI_Ibarrier(comm_, &r->req_));
    finish(Collective::Barrier, std::move(r)).wait();
  }

  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MT_MPI(where(), MPI_Comm_split(comm_, color, key, &sub));
    return std::make_unique<MpiComm>(sub, true, name, world_rank_, opt_, peers_);
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
  }

 private:
  std::unique_ptr<MpiRequest> start(Collective c, int64_t sent, int64_t recv) {
    CollectiveStats& s = stats_.at(c);
    ++s.calls;
    if (peers_ && world_rank_ == peers_->kill_rank && peers_->kill_in == collective_name(c) &&
        s.calls == peers_->kill_call)
      ::kill(::getpid(), peers_->kill_signal);
    s.bytes_sent += sent;
    s.bytes_recv += recv;
    t0_ = Clock::now();
    if (pool_.empty()) return std::make_unique<MpiRequest>(*this, c, sent, recv);
    std::unique_ptr<MpiRequest> r = std::move(pool_.back());
    pool_.pop_back();
    r->reuse(c, sent, recv);
    return r;
  }
  Request finish(Collective c, std::unique_ptr<MpiRequest> r) {
    stats_.at(c).seconds += seconds_since(t0_);
    return Request(std::move(r));
  }

  friend class MpiRequest;
  MPI_Comm comm_;
  bool owned_;
  std::string name_;
  int world_rank_;
  CommOptions opt_;
  std::shared_ptr<const Peers> peers_;
  int rank_ = 0, size_ = 1;
  Clock::time_point t0_;
  // Completed requests, kept for the next collectives: after warm-up (the most requests ever in
  // flight at once) a collective allocates nothing of ours.
  std::vector<std::unique_ptr<MpiRequest>> pool_;
};

void MpiRequest::recycle() {
  // A timed-out or failed request may still be written by MPI: never reused (see ~MpiRequest).
  if (timed_out_) {
    delete this;
    return;
  }
  if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  comm_.pool_.emplace_back(this);
}

// MPI_Test inside a wait: a failure (a peer's connection lost, with recovery enabled) names the
// collective and the peers found dead, as a timeout does.
void MpiRequest::poll(int* flag) {
  const int rc = MPI_Test(&req_, flag, MPI_STATUS_IGNORE);
  if (rc == MPI_SUCCESS) return;
  timed_out_ = true;  // abandoned like a timed-out request
  throw CommError(
      __FILE__, __LINE__,
      cat(comm_.where(), ": ", collective_name(coll_), " (sending ", sent_, " B, receiving ", recv_,
          " B) failed: ", mpi_error_text(rc), comm_.peer_state()));
}

void MpiRequest::wait() {
  const auto t0 = Clock::now();
  int flag = 0;
  poll(&flag);
  const bool idle = !flag;
  // Poll rather than MPI_Wait so the wait can give up; sleeping between polls leaves the core to
  // the peers when ranks outnumber cores (oversubscribed test runs).
  for (int spins = 0; !flag; ++spins) {
    if (Clock::now() - t0 > comm_.options().timeout) {
      timed_out_ = true;
      const auto ms = comm_.options().timeout.count();
      throw CommError(__FILE__, __LINE__,
                      cat(comm_.where(), ": ", collective_name(coll_), " (sending ", sent_,
                          " B, receiving ", recv_, " B) did not complete within ", ms,
                          " ms; a peer rank has failed or stalled", comm_.peer_state()));
    }
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    poll(&flag);
  }
  CollectiveStats& s = comm_.stats_.at(coll_);
  const double dt = seconds_since(t0);
  s.seconds += dt;
  if (idle) s.idle_seconds += dt;
}

class LocalComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string where() const override { return "world rank 0/1"; }

  Request iall_reduce(void*, int64_t count, Elem e) override {
    count_(Collective::AllReduce, count, e, count);
    return done();
  }
  Request iall_gather(const void* send, int64_t count, void* recv, Elem e) override {
    copy(recv, send, count, e);
    count_(Collective::AllGather, count, e, count);
    return done();
  }
  Request ireduce_scatter(const void* send, void* recv, int64_t count, Elem e) override {
    copy(recv, send, count, e);
    count_(Collective::ReduceScatter, count, e, count);
    return done();
  }
  Request iall_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& send_displs, void* recv,
                        const std::vector<int64_t>& recv_counts,
                        const std::vector<int64_t>& recv_displs, Elem e) override {
    MT_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_displs.size() == 1 &&
                 recv_displs.size() == 1 && send_counts[0] == recv_counts[0],
             ValueError, "all_to_all_v on one rank: sends ",
             send_counts.size() ? send_counts[0] : -1, " elements, receives ",
             recv_counts.size() ? recv_counts[0] : -1);
    const size_t es = elem_size(e);
    copy(static_cast<char*>(recv) + static_cast<size_t>(recv_displs[0]) * es,
         static_cast<const char*>(send) + static_cast<size_t>(send_displs[0]) * es, send_counts[0],
         e);
    count_(Collective::AllToAllV, send_counts[0], e, send_counts[0]);
    return done();
  }
  Request ibroadcast(void*, int64_t count, Elem e, int root) override {
    MT_CHECK(root == 0, ValueError, "broadcast root ", root, " on a world of 1");
    count_(Collective::Broadcast, 0, e, 0);
    (void)count;
    return done();
  }
  void barrier() override { ++stats_.at(Collective::Barrier).calls; }
  std::unique_ptr<Comm> split(int, int, const std::string&) override {
    return std::make_unique<LocalComm>();
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 private:
  static Request done() {
    static DoneImpl shared;
    return Request(std::unique_ptr<Request::Impl>(&shared));
  }
  static void copy(void* dst, const void* src, int64_t count, Elem e) {
    if (dst != src && count > 0) std::memmove(dst, src, static_cast<size_t>(count) * elem_size(e));
  }
  void count_(Collective c, int64_t sent, Elem e, int64_t recv) {
    CollectiveStats& s = stats_.at(c);
    ++s.calls;
    s.bytes_sent += sent * static_cast<int64_t>(elem_size(e));
    s.bytes_recv += recv * static_cast<int64_t>(elem_size(e));
  }
};

}  // namespace

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::F32:
    case Elem::I32:
      return 4;
    case Elem::F64:
    case Elem::I64:
      return 8;
    case Elem::BF16:
      return 2;
  }
  return 0;
}

Elem elem_of(DType d) {
  switch (d) {
    case DType::F32:
      return Elem::F32;
    case DType::BF16:
      return Elem::BF16;
    case DType::I32:
      return Elem::I32;
    case DType::I64:
      return Elem::I64;
    case DType::F64:
      return Elem::F64;
  }
  MT_THROW(InternalError, "no element type for dtype ", static_cast<int>(d));
}

namespace {

// What the transport can read and write: contiguous memory where it works (the host for MPI).
void check_host(const Comm& c, const Tensor& t, const char* what) {
  MT_CHECK(t.defined() && t.device() == c.memory() && t.is_contiguous(), ValueError, c.where(),
           ": ", what, " must be a contiguous ", c.memory() == Device::CPU ? "host" : "device",
           " tensor");
}

void check_count(const Comm& c, const Tensor& t, int64_t n, const char* what) {
  MT_CHECK(t.numel() == n, ShapeError, c.where(), ": ", what, " has ", t.numel(),
           " elements, expected ", n);
}

void check_same_dtype(const Comm& c, const Tensor& a, const Tensor& b) {
  MT_CHECK(a.dtype() == b.dtype(), ValueError, c.where(), ": send and receive dtypes differ");
}

}  // namespace

Request Comm::iall_reduce(Tensor& t) {
  check_host(*this, t, "all_reduce tensor");
  return iall_reduce(t.raw(), t.numel(), elem_of(t.dtype()));
}

Request Comm::iall_gather(const Tensor& send, Tensor& recv) {
  check_host(*this, send, "all_gather send");
  check_host(*this, recv, "all_gather recv");
  check_same_dtype(*this, send, recv);
  check_count(*this, recv, send.numel() * size(), "all_gather recv");
  return iall_gather(send.raw(), send.numel(), recv.raw(), elem_of(send.dtype()));
}

Request Comm::ireduce_scatter(const Tensor& send, Tensor& recv) {
  check_host(*this, send, "reduce_scatter send");
  check_host(*this, recv, "reduce_scatter recv");
  check_same_dtype(*this, send, recv);
  check_count(*this, send, recv.numel() * size(), "reduce_scatter send");
  return ireduce_scatter(send.raw(), recv.raw(), recv.numel(), elem_of(send.dtype()));
}

Request Comm::iall_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_displs, Tensor& recv,
                            const std::vector<int64_t>& recv_counts,
                            const std::vector<int64_t>& recv_displs) {
  check_host(*this, send, "all_to_all_v send");
  check_host(*this, recv, "all_to_all_v recv");
  check_same_dtype(*this, send, recv);
  for (size_t p = 0; p < send_counts.size() && p < send_displs.size(); ++p)
    MT_CHECK(send_displs[p] >= 0 && send_displs[p] + send_counts[p] <= send.numel(), ShapeError,
             where(), ": all_to_all_v sends [", send_displs[p], ", +", send_counts[p], ") to peer ",
             p, " of ", send.numel(), " elements");
  for (size_t p = 0; p < recv_counts.size() && p < recv_displs.size(); ++p)
    MT_CHECK(recv_displs[p] >= 0 && recv_displs[p] + recv_counts[p] <= recv.numel(), ShapeError,
             where(), ": all_to_all_v receives [", recv_displs[p], ", +", recv_counts[p],
             ") from peer ", p, " into ", recv.numel(), " elements");
  return iall_to_all_v(send.raw(), send_counts, send_displs, recv.raw(), recv_counts, recv_displs,
                       elem_of(send.dtype()));
}

Request Comm::ibroadcast(Tensor& t, int root) {
  check_host(*this, t, "broadcast tensor");
  return ibroadcast(t.raw(), t.numel(), elem_of(t.dtype()), root);
}

void Comm::check_peer_counts(const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs,
                             const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs) const {
  const size_t P = static_cast<size_t>(size());
  MT_CHECK(send_counts.size() == P && send_displs.size() == P && recv_counts.size() == P &&
               recv_displs.size() == P,
           ValueError, where(), ": all_to_all_v needs ", P, " counts and displacements");
}

const char* collective_name(Collective c) {
  static constexpr const char* kNames[kNumCollectives] = {
      "all_gather", "reduce_scatter", "all_reduce", "all_to_all_v", "broadcast", "barrier"};
  return kNames[static_cast<int>(c)];
}

CollectiveStats& CollectiveStats::operator+=(const CollectiveStats& o) {
  calls += o.calls;
  bytes_sent += o.bytes_sent;
  bytes_recv += o.bytes_recv;
  seconds += o.seconds;
  idle_seconds += o.idle_seconds;
  device_seconds += o.device_seconds;
  return *this;
}

CollectiveStats CommStats::total() const {
  CollectiveStats t;
  for (const CollectiveStats& s : per) t += s;
  return t;
}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (impl_) {
      try {
        impl_->wait();
      } catch (...) {
      }
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}

Request::~Request() {
  if (!impl_) return;
  try {
    impl_->wait();
  } catch (...) {
    // Destructors must not throw; the error surfaces at the next collective instead.
  }
}

void Request::wait() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  impl->wait();
}

std::unique_ptr<Comm> make_local_comm() {
  return std::make_unique<LocalComm>();
}

int local_rank(Comm& world) {
  std::vector<uint64_t> hosts(static_cast<size_t>(world.size()));
  const uint64_t mine = host_hash();
  world.all_gather(&mine, 1, hosts.data(), Elem::I64);
  int below = 0;
  for (int r = 0; r < world.rank(); ++r) below += hosts[static_cast<size_t>(r)] == mine;
  return below;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  // FUNNELED: only the main thread calls MPI; OpenMP threads never do.
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS)
    throw CommError(__FILE__, __LINE__, cat("MPI_Init_thread failed: ", mpi_error_text(rc)));
}

MpiRuntime::~MpiRuntime() {
  MPI_Finalize();
}

std::unique_ptr<Comm> MpiRuntime::world(const CommOptions& opt) const {
  int rank = 0, size = 1;
  MT_MPI("world", MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MT_MPI("world", MPI_Comm_size(MPI_COMM_WORLD, &size));
  auto peers = std::make_shared<Peers>();
  peers->pid.resize(static_cast<size_t>(size));
  peers->host.resize(static_cast<size_t>(size));
  peers->my_host = host_hash();
  const auto pid = static_cast<int64_t>(::getpid());
  MT_MPI("world",
         MPI_Allgather(&pid, 1, MPI_INT64_T, peers->pid.data(), 1, MPI_INT64_T, MPI_COMM_WORLD));
  MT_MPI("world", MPI_Allgather(&peers->my_host, 1, MPI_UINT64_T, peers->host.data(), 1,
                                MPI_UINT64_T, MPI_COMM_WORLD));
  if (const char* r = std::getenv("MOETRAIN_FAULT_KILL_RANK")) {
    peers->kill_rank = std::atoi(r);
    const char* in = std::getenv("MOETRAIN_FAULT_KILL_IN");
    const char* call = std::getenv("MOETRAIN_FAULT_KILL_CALL");
    peers->kill_in = in ? in : "";
    peers->kill_call = call ? std::atoll(call) : 1;
    const char* sig = std::getenv("MOETRAIN_FAULT_SIGNAL");
    const std::string how = sig ? sig : "KILL";
    MT_CHECK(how == "KILL" || how == "STOP", ConfigError, "MOETRAIN_FAULT_SIGNAL = '", how,
             "': KILL or STOP");
    peers->kill_signal = how == "STOP" ? SIGSTOP : SIGKILL;
  }
  return std::make_unique<MpiComm>(MPI_COMM_WORLD, false, "world", rank, opt, std::move(peers));
}

bool MpiRuntime::launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

}  // namespace mt::par
