// WorkAxon (see WorkAxon.h).
#include "WorkAxon.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "CommTypes.h"

namespace at::axon {

void OpState::setError(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = e;
}

std::string OpState::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

WorkAxon::WorkAxon(int rank, c10d::OpType type, const char* profiling_title,
                   c10::DeviceIndex device, std::shared_ptr<OpState> state, c10::Event end,
                   c10::intrusive_ptr<c10::ivalue::Future> future,
                   std::vector<at::Tensor> outputs, bool ran_inline)
    : c10d::Work(rank, type, profiling_title),
      ran_inline_(ran_inline),
      name_(profiling_title != nullptr ? profiling_title : "collective"),
      device_(device),
      state_(std::move(state)),
      end_(std::move(end)),
      future_(std::move(future)),
      outputs_(std::move(outputs)) {}

namespace {
// Whether the work before `end` has run, reporting no error (c10::Event::query
// raises the stream's pending asynchronous errors, as CUDA's; a Work's state
// queries must not consume them).
bool ended(const c10::Event& end) {
  void* e = end.eventId();
  return e == nullptr ||
         rt_call([&] { return ::axon::rt::event_query(static_cast<::axon::rt::Event*>(e)); });
}
}  // namespace

bool WorkAxon::isCompleted() { return ended(end_); }

bool WorkAxon::isSuccess() const { return ended(end_) && state_->error().empty(); }

std::exception_ptr WorkAxon::exception() const {
  std::string e = state_->error();
  if (e.empty()) return nullptr;
  return std::make_exception_ptr(c10::DistBackendError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e));
}

std::vector<at::Tensor> WorkAxon::result() { return outputs_; }

bool WorkAxon::wait(std::chrono::milliseconds timeout) {
  std::string e = state_->error();
  if (!e.empty()) throwDistError(e);
  // Finished already (or before the call returned): nothing to order, and
  // its error, if any, was raised above.
  if (ran_inline_ || ended(end_)) return true;
  if (timeout != kNoTimeout) {
    // As NCCL's and gloo's wait(timeout): the host waits for the collective,
    // at most `timeout`, and raises when it has not finished by then.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(50);
    while (!ended(end_) && state_->error().empty()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throwDistError(std::string("ProcessGroupAxon: ") + name_ + " on rank " +
                       std::to_string(rank_) + ": wait(timeout=" +
                       std::to_string(timeout.count()) +
                       " ms) timed out before the collective finished");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
    e = state_->error();
    if (!e.empty()) throwDistError(e);
    return true;
  }
  c10::Stream current = getCurrentAxonStream(device_);
  end_.block(current);
  auto state = state_;
  rt_call([&] {
    ::axon::rt::launch(to_rt(current), "c10d::wait (axon)", [state] {
      std::string err = state->error();
      if (!err.empty()) throw std::runtime_error(err);
    });
  });
  return true;
}

void WorkAxon::synchronize() { wait(kNoTimeout); }

c10::intrusive_ptr<c10::ivalue::Future> WorkAxon::getFuture() { return future_; }

void WorkAxon::hostWait() {
  try {
    end_.synchronize();
  } catch (const std::exception&) {
    // The communication stream's pending error is the collective's.
  }
  std::string e = state_->error();
  if (!e.empty()) throwDistError(e);
}

}  // namespace at::axon
