// A process group of one rank that needs no MPI: every collective is a copy. Used where a model runs
// without a process grid (unit tests of the model, single-process tools).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/comm/process_group.h"

namespace touchstone {

class SingleRankGroup final : public ProcessGroup {
 public:
  explicit SingleRankGroup(std::string name = "single") : name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int global_rank(int) const override { return 0; }

  void all_reduce_sum(double*, int64_t, const Shape&) override {}
  void all_reduce_sum(int64_t*, int64_t) override {}
  void all_reduce_max(double*, int64_t, const Shape&) override {}
  void all_gather(const double* send, double* recv, int64_t count, const Shape&) override {
    std::copy_n(send, count, recv);
  }
  void reduce_scatter_sum(const double* send, double* recv, int64_t count, const Shape&) override {
    std::copy_n(send, count, recv);
  }
  void broadcast(double*, int64_t, int, const Shape&) override {}
  void all_to_all(const double* send, double* recv, int64_t count, const Shape&) override {
    std::copy_n(send, count, recv);
  }
  void send(const double*, int64_t, int, int, const Shape&) override { no_peer(); }
  void recv(double*, int64_t, int, int, const Shape&) override { no_peer(); }
  void wait_sends() override {}
  void barrier() override {}

 private:
  [[noreturn]] void no_peer() const { throw std::logic_error("group " + name_ + " has one rank: no peer"); }
  std::string name_;
};

}  // namespace touchstone
