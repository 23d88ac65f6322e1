// WorkAxon: the c10d Work of a ProcessGroupAxon collective, and OpState, what
// the collective's stream work reports back to it.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace at::axon {

// The first error of a collective (set by whichever thread ran it).
class OpState {
 public:
  void setError(const std::string& e);
  std::string error();

 private:
  std::mutex mu_;
  std::string error_;
};

// `end` is recorded on the communication stream after the collective (an
// unrecorded event when it ran on the calling thread, `ran_inline`).
class WorkAxon : public c10d::Work {
 public:
  WorkAxon(int rank, c10d::OpType type, const char* profiling_title, c10::DeviceIndex device,
           std::shared_ptr<OpState> state, c10::Event end,
           c10::intrusive_ptr<c10::ivalue::Future> future, std::vector<at::Tensor> outputs,
           bool ran_inline = false);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Orders the caller's current stream after the collective (no host wait).
  // If the collective fails, the error is raised by stream work queued behind
  // it, so it surfaces at the caller's next synchronisation.  With a timeout
  // the host waits for the collective, raising if it did not finish in time.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Blocks the host until the collective ran; raises its error.
  void hostWait();

 private:
  bool ran_inline_;
  std::string name_;
  c10::DeviceIndex device_;
  std::shared_ptr<OpState> state_;
  c10::Event end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> outputs_;
};

}  // namespace at::axon
