// The host logic of the communication backends: their names and the up-front availability check, and
// the ordered maximum that the MPI operator and the NCCL group's kernel share. Parsing `--comm` is the
// command line's (tests/cli/test_bad_input.py).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/errors.h"
#include "parallel/comm/comm_backend.h"
#include "parallel/comm/ordered_max.h"

namespace touchstone {
namespace {

TEST(CommBackend, Names) {
  EXPECT_EQ(comm_backend_name(CommBackend::kMpi), "mpi");
  EXPECT_EQ(comm_backend_name(CommBackend::kNccl), "nccl");
}

TEST(CommBackend, MpiIsAlwaysAvailable) { EXPECT_NO_THROW(check_comm_available(CommBackend::kMpi)); }

TEST(CommBackend, NcclNamesWhyItCannotRun) {
  try {
    check_comm_available(CommBackend::kNccl);
#if !defined(TOUCHSTONE_HAVE_CUDA)
    ADD_FAILURE() << "a build without CUDA accepted NCCL";
#endif
  } catch (const InputError& e) {
    // The reason alone: the command line puts the flag in front ("--comm nccl: ...").
    const std::string message = e.what();
    EXPECT_EQ(message.find("--"), std::string::npos) << message;
#if defined(TOUCHSTONE_HAVE_CUDA)
    EXPECT_NE(message.find("no CUDA device"), std::string::npos) << message;  // only when there is no GPU
#else
    EXPECT_NE(message.find("this build has no CUDA backend"), std::string::npos) << message;
#endif
  }
}

uint64_t bits(double value) { return std::bit_cast<uint64_t>(value); }

TEST(OrderedMax, IsATotalOrderWithPositiveZeroAboveNegativeZero) {
  EXPECT_EQ(bits(ordered_max(-0.0, 0.0)), bits(0.0));
  EXPECT_EQ(bits(ordered_max(0.0, -0.0)), bits(0.0));
  EXPECT_EQ(bits(ordered_max(-0.0, -0.0)), bits(-0.0));
  EXPECT_EQ(ordered_max(-1.0, 2.0), 2.0);
  EXPECT_EQ(ordered_max(INFINITY, 1e308), INFINITY);
  EXPECT_EQ(ordered_max(-INFINITY, -1e308), -1e308);
}

TEST(OrderedMax, AnyNanGivesTheOneCanonicalQuietNan) {
  const uint64_t canonical = bits(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(kCanonicalNanBits, canonical);
  const std::vector<double> nans = {std::bit_cast<double>(uint64_t{0x7ff8000000000abcULL}),
                                    std::bit_cast<double>(uint64_t{0xfff8000000000000ULL}),
                                    std::bit_cast<double>(uint64_t{0x7ff0000000000001ULL})};  // signalling
  for (double nan : nans) {
    EXPECT_EQ(bits(ordered_max(nan, 1.0)), canonical);
    EXPECT_EQ(bits(ordered_max(-INFINITY, nan)), canonical);
    EXPECT_EQ(bits(ordered_max(nan, nan)), canonical);
  }
}

TEST(OrderedMax, TheOrderOfTheOperandsNeverChangesTheBits) {
  const std::vector<double> values = {
      -0.0,   0.0,      1.0,
      -1.0,   INFINITY, -INFINITY,
      1e-310, -1e-310,  std::bit_cast<double>(uint64_t{0xfff8000000000123ULL})};
  for (double a : values) {
    for (double b : values) {
      EXPECT_EQ(bits(ordered_max(a, b)), bits(ordered_max(b, a))) << a << " " << b;
      for (double c : values) {
        EXPECT_EQ(bits(ordered_max(ordered_max(a, b), c)), bits(ordered_max(a, ordered_max(b, c))));
      }
    }
  }
}

}  // namespace
}  // namespace touchstone
