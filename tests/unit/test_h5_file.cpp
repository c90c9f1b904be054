// Tests of the HDF5 layer: typed round trips, attributes, atomic commit and the reader's errors.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/h5_file.h"
#include "test_files.h"

namespace touchstone::h5 {
namespace {

using touchstone::testing::expect_input_error;

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class H5FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("touchstone_h5_" + std::to_string(getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string temp_of(const std::string& final_path) {
    return final_path + ".tmp." + std::to_string(getpid());
  }

  // Only the entries directly in the test directory, to see stray temporary files.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// The stored HDF5 type of a dataset, to check what other readers (h5py) will see.
struct StoredType {
  H5T_class_t type_class;
  size_t size;
};

StoredType stored_type(const std::string& file_path, const std::string& dataset_path) {
  const hid_t file = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, dataset_path.c_str(), H5P_DEFAULT);
  const hid_t type = H5Dget_type(dataset);
  const StoredType result{H5Tget_class(type), H5Tget_size(type)};
  H5Tclose(type);
  H5Dclose(dataset);
  H5Fclose(file);
  return result;
}

TEST_F(H5FileTest, RoundTripsEveryType) {
  const std::string path = file("golden.h5");
  const std::vector<double> f64 = {1.5, -2.25, 1e-300, 3.0, 0.1, -0.0};
  const std::vector<double> f32_source = {0.1, -1.0 / 3.0, 1e10, 2.0};
  const std::vector<int32_t> i32 = {
      0, -100, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 7, 8};
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::max(), -1, 0};
  {
    H5Writer writer(path);
    writer.write_f64("/params/init/decoder.layers.0.mlp.linear_fc1.weight", f64.data(), {2, 3});
    writer.write_f32("/params/init/output_layer.weight", f32_source.data(), {4});
    writer.write_i32("/batch/tokens", i32.data(), {1, 2, 3});
    writer.write_i64("/counts", i64.data(), {3});
    writer.write_scalar_f64("/steps/1/loss", 5.546875);
    writer.write_scalar_i64("/steps/1/num_loss_tokens", 123456789012LL);
    writer.commit();
  }

  H5Reader reader(path);
  const std::string fc1 = "/params/init/decoder.layers.0.mlp.linear_fc1.weight";
  EXPECT_EQ(reader.shape(fc1), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(reader.read_f64(fc1), f64);
  EXPECT_EQ(reader.shape("/params/init/output_layer.weight"), (std::vector<int64_t>{4}));
  EXPECT_EQ(reader.shape("/batch/tokens"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(reader.read_i32("/batch/tokens"), i32);
  EXPECT_EQ(reader.read_i64("/counts"), i64);
  EXPECT_EQ(reader.shape("/steps/1/loss"), std::vector<int64_t>{});
  EXPECT_EQ(reader.read_f64("/steps/1/loss"), std::vector<double>{5.546875});
  EXPECT_EQ(reader.read_i64("/steps/1/num_loss_tokens"), std::vector<int64_t>{123456789012LL});

  // Integers convert to doubles on request, and int32 data widens to int64.
  EXPECT_EQ(reader.read_f64("/batch/tokens")[1], -100.0);
  EXPECT_EQ(reader.read_i64("/batch/tokens")[3], std::numeric_limits<int32_t>::min());

  // The stored types are the documented ones.
  EXPECT_EQ(stored_type(path, fc1).type_class, H5T_FLOAT);
  EXPECT_EQ(stored_type(path, fc1).size, 8u);
  EXPECT_EQ(stored_type(path, "/params/init/output_layer.weight").size, 4u);
  EXPECT_EQ(stored_type(path, "/batch/tokens").type_class, H5T_INTEGER);
  EXPECT_EQ(stored_type(path, "/batch/tokens").size, 4u);
  EXPECT_EQ(stored_type(path, "/steps/1/num_loss_tokens").size, 8u);
}

TEST_F(H5FileTest, Float32RoundsToNearest) {
  const std::string path = file("f32.h5");
  const std::vector<double> source = {0.1, 1.0 / 3.0, -2.7, 1e-40, 1e300};
  {
    H5Writer writer(path);
    writer.write_f32("/x", source.data(), {5});
    writer.commit();
  }
  const std::vector<double> back = H5Reader(path).read_f64("/x");
  ASSERT_EQ(back.size(), source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    EXPECT_EQ(back[i], static_cast<double>(static_cast<float>(source[i]))) << i;
  }
  EXPECT_NE(back[0], 0.1);
  EXPECT_EQ(back[4], std::numeric_limits<double>::infinity());
}

TEST_F(H5FileTest, DottedNamesAreSingleLinks) {
  const std::string path = file("dots.h5");
  const double value = 1.0;
  {
    H5Writer writer(path);
    writer.write_f64("/steps/1/grads/decoder.layers.0.mlp.linear_fc1.weight", &value, {1});
    writer.write_f64("/steps/1/grads/embedding.word_embeddings.weight", &value, {1});
    writer.commit();
  }
  H5Reader reader(path);
  EXPECT_EQ(reader.children("/steps/1/grads"),
            (std::vector<std::string>{"decoder.layers.0.mlp.linear_fc1.weight",
                                      "embedding.word_embeddings.weight"}));
  EXPECT_FALSE(reader.exists("/steps/1/grads/decoder"));
  EXPECT_TRUE(reader.exists("/steps/1/grads/decoder.layers.0.mlp.linear_fc1.weight"));
}

// A group linked into itself (or any object under two names) is listed once: the walk must end.
TEST_F(H5FileTest, DatasetsBelowWalksEachObjectOnce) {
  const std::string path = file("cycle.h5");
  const double value = 1.0;
  {
    H5Writer writer(path);
    writer.write_f64("/steps/1/grads/a", &value, {1});
    writer.write_f64("/steps/1/params/b", &value, {1});
    writer.commit();
  }
  {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    ASSERT_GE(H5Lcreate_hard(f, "/steps/1", f, "/steps/1/grads/loop", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_hard(f, "/steps/1", f, "/steps/1/params/loop", H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  const H5Reader reader(path);
  EXPECT_EQ(reader.datasets_below("/steps/1"),
            (std::vector<std::string>{"steps/1/grads/a", "steps/1/params/b"}));
  EXPECT_EQ(reader.datasets_below("/"), (std::vector<std::string>{"steps/1/grads/a", "steps/1/params/b"}));
  EXPECT_TRUE(reader.datasets_below("/steps/2").empty());
}

TEST_F(H5FileTest, ZeroElementShapes) {
  const std::string path = file("empty.h5");
  {
    H5Writer writer(path);
    writer.write_f64("/a", nullptr, {0});
    writer.write_i32("/b", nullptr, {3, 0});
    writer.write_f32("/c", nullptr, {0, 2});
    writer.commit();
  }
  H5Reader reader(path);
  EXPECT_EQ(reader.shape("/a"), std::vector<int64_t>{0});
  EXPECT_TRUE(reader.read_f64("/a").empty());
  EXPECT_EQ(reader.shape("/b"), (std::vector<int64_t>{3, 0}));
  EXPECT_TRUE(reader.read_i32("/b").empty());
  EXPECT_EQ(reader.shape("/c"), (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(reader.read_f64("/c").empty());
}

TEST_F(H5FileTest, Attributes) {
  const std::string path = file("attrs.h5");
  const std::string config = std::string("{\"model\": {\"vocab_size\": 256}, \"note\": \"h\xc3\xa9\"}") +
                             std::string(100000, ' ');  // longer than an object header can hold
  const double value = 2.0;
  {
    H5Writer writer(path);
    writer.set_attribute("/", "format", std::string("touchstone-golden"));
    writer.set_attribute("/", "format_version", int64_t{1});
    writer.set_attribute("/", "config", config);
    writer.set_attribute("/", "scale", 0.125);
    writer.set_attribute("/", "empty", std::string());
    writer.write_f64("/steps/1/loss", &value, {});
    writer.set_attribute("/steps/1", "note", std::string("group attribute"));
    writer.set_attribute("/steps/1/loss", "unit", std::string("nats"));
    writer.set_attribute("/", "format_version", int64_t{-7});  // a second set replaces the first
    writer.commit();
  }
  H5Reader reader(path);
  EXPECT_EQ(reader.string_attribute("/", "format"), "touchstone-golden");
  EXPECT_EQ(reader.int_attribute("/", "format_version"), -7);
  EXPECT_EQ(reader.string_attribute("/", "config"), config);
  EXPECT_EQ(reader.string_attribute("/", "empty"), "");
  EXPECT_EQ(reader.string_attribute("/steps/1", "note"), "group attribute");
  EXPECT_EQ(reader.string_attribute("/steps/1/loss", "unit"), "nats");

  expect_input_error([&] { reader.string_attribute("/", "missing"); }, {path, "missing", "/"});
  expect_input_error([&] { reader.string_attribute("/", "format_version"); }, {path, "format_version"});
  expect_input_error([&] { reader.int_attribute("/", "format"); }, {path, "format"});
  expect_input_error([&] { reader.int_attribute("/", "scale"); }, {path, "scale"});
  expect_input_error([&] { reader.int_attribute("/nowhere", "format"); }, {path, "/nowhere"});
}

// Files written by other tools may store strings with a fixed length; those read the same way.
TEST_F(H5FileTest, ReadsFixedLengthStringAttributes) {
  const std::string path = file("fixed.h5");
  const hid_t file_id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t space = H5Screate(H5S_SCALAR);
  struct Case {
    const char* name;
    H5T_str_t pad;
    std::string bytes;
  };
  const std::vector<Case> cases = {{"nullterm", H5T_STR_NULLTERM, std::string("abc\0\0\0", 6)},
                                   {"nullpad", H5T_STR_NULLPAD, std::string("abc\0\0\0", 6)},
                                   {"spacepad", H5T_STR_SPACEPAD, std::string("abc   ", 6)},
                                   {"full", H5T_STR_NULLPAD, std::string("abcdef", 6)}};
  for (const Case& c : cases) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 6);
    H5Tset_strpad(type, c.pad);
    H5Tset_cset(type, H5T_CSET_UTF8);
    const hid_t attr = H5Acreate2(file_id, c.name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, c.bytes.data());
    H5Aclose(attr);
    H5Tclose(type);
  }
  H5Sclose(space);
  H5Fclose(file_id);

  H5Reader reader(path);
  EXPECT_EQ(reader.string_attribute("/", "nullterm"), "abc");
  EXPECT_EQ(reader.string_attribute("/", "nullpad"), "abc");
  EXPECT_EQ(reader.string_attribute("/", "spacepad"), "abc");
  EXPECT_EQ(reader.string_attribute("/", "full"), "abcdef");
}

TEST_F(H5FileTest, CommitLeavesOnlyTheFinalFile) {
  const std::string path = file("out.h5");
  const double value = 3.0;
  {
    H5Writer writer(path);
    EXPECT_EQ(writer.final_path(), path);
    writer.write_scalar_f64("/loss", value);
    // Until commit, only the temporary file exists.
    EXPECT_TRUE(fs::exists(temp_of(path)));
    EXPECT_FALSE(fs::exists(path));
    writer.commit();
    EXPECT_TRUE(fs::exists(path));
    EXPECT_FALSE(fs::exists(temp_of(path)));
    EXPECT_THROW(writer.write_scalar_f64("/other", value), std::runtime_error);
    EXPECT_THROW(writer.set_attribute("/", "late", int64_t{1}), std::runtime_error);
    EXPECT_THROW(writer.commit(), std::runtime_error);
  }
  // The destructor of a committed writer leaves the final file alone.
  EXPECT_EQ(entries(), std::vector<std::string>{"out.h5"});
  EXPECT_EQ(H5Reader(path).read_f64("/loss"), std::vector<double>{3.0});
}

TEST_F(H5FileTest, CommitReplacesAnOlderFile) {
  const std::string path = file("out.h5");
  for (double value : {1.0, 2.0}) {
    H5Writer writer(path);
    writer.write_scalar_f64("/loss", value);
    writer.commit();
  }
  EXPECT_EQ(H5Reader(path).read_f64("/loss"), std::vector<double>{2.0});
  EXPECT_EQ(entries(), std::vector<std::string>{"out.h5"});
}

TEST_F(H5FileTest, UncommittedWriterRemovesItsTemporaryFile) {
  const std::string path = file("abandoned.h5");
  {
    H5Writer writer(path);
    writer.write_scalar_f64("/loss", 1.0);
    EXPECT_TRUE(fs::exists(temp_of(path)));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(entries().empty());
}

TEST_F(H5FileTest, ExceptionMidWriteLeavesNothing) {
  const std::string path = file("failed.h5");
  const double value = 1.0;
  EXPECT_THROW(
      {
        H5Writer writer(path);
        writer.write_f64("/params/init/output_layer.weight", &value, {1});
        // A second dataset at the same path is an error, thrown out of the writer's scope.
        writer.write_f64("/params/init/output_layer.weight", &value, {1});
        writer.commit();
      },
      std::runtime_error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(entries().empty());

  EXPECT_THROW(
      {
        H5Writer writer(path);
        writer.write_f64("/params/init/output_layer.weight", &value, {1});
        throw std::runtime_error("failure elsewhere");
      },
      std::runtime_error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(entries().empty());
}

TEST_F(H5FileTest, FailedCommitLeavesNoTemporaryFile) {
  // A non-empty directory at the final path makes the rename fail.
  const std::string path = file("out.h5");
  fs::create_directories(path);
  std::ofstream(path + "/keep") << "x";
  {
    H5Writer writer(path);
    writer.write_scalar_f64("/loss", 1.0);
    EXPECT_THROW(writer.commit(), std::runtime_error);
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"out.h5"});
  EXPECT_TRUE(fs::is_directory(path));
}

TEST_F(H5FileTest, WriterErrorsNameTheFileAndObject) {
  const std::string path = file("w.h5");
  const double value = 1.0;
  H5Writer writer(path);
  writer.write_f64("/steps/1/loss", &value, {});
  auto expect_message = [&](auto fn, const std::string& object) {
    try {
      fn();
      ADD_FAILURE() << "no exception thrown";
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find(object), std::string::npos) << message;
    }
  };
  expect_message([&] { writer.write_f64("/steps/1/loss", &value, {}); }, "/steps/1/loss");
  expect_message([&] { writer.write_f64("/steps/1/loss/x", &value, {1}); }, "/steps/1/loss/x");
  expect_message([&] { writer.write_f64("/neg", &value, {-1}); }, "/neg");
  expect_message([&] { writer.write_f64("relative", &value, {1}); }, "relative");
  expect_message([&] { writer.write_f64("/nodata", nullptr, {2}); }, "/nodata");
  expect_message([&] { writer.set_attribute("/missing", "a", int64_t{1}); }, "/missing");
}

TEST_F(H5FileTest, WriterCannotCreateInAMissingDirectory) {
  EXPECT_THROW(H5Writer(file("no/such/dir/out.h5")), std::runtime_error);
}

TEST_F(H5FileTest, ReaderErrors) {
  const std::string missing = file("missing.h5");
  expect_input_error([&] { H5Reader reader(missing); }, {missing, "cannot open as HDF5"});

  const std::string text = file("not_hdf5.h5");
  std::ofstream(text) << "this is not an HDF5 file\n";
  expect_input_error([&] { H5Reader reader(text); }, {text, "cannot open as HDF5"});

  const std::string path = file("golden.h5");
  const std::vector<double> floats = {0.5, 1.5};
  const std::vector<int64_t> wide = {int64_t{1} << 40};
  {
    H5Writer writer(path);
    writer.write_f64("/params/init/embedding.word_embeddings.weight", floats.data(), {2});
    writer.write_i64("/wide", wide.data(), {1});
    writer.commit();
  }
  H5Reader reader(path);
  EXPECT_EQ(reader.path(), path);
  const std::string absent = "/params/init/output_layer.weight";
  expect_input_error([&] { reader.read_f64(absent); }, {path, "no dataset " + absent});
  expect_input_error([&] { reader.read_i32(absent); }, {path, absent});
  expect_input_error([&] { reader.read_i64(absent); }, {path, absent});
  expect_input_error([&] { reader.shape(absent); }, {path, absent});
  expect_input_error([&] { reader.read_f64("/nowhere/at/all"); }, {path, "/nowhere/at/all"});
  expect_input_error([&] { reader.read_f64("/params/init"); }, {path, "/params/init"});
  expect_input_error([&] { reader.read_i32("/params/init/embedding.word_embeddings.weight"); },
                     {path, "/params/init/embedding.word_embeddings.weight", "integer"});
  expect_input_error([&] { reader.read_i64("/params/init/embedding.word_embeddings.weight"); },
                     {path, "/params/init/embedding.word_embeddings.weight"});
  expect_input_error([&] { reader.read_i32("/wide"); }, {path, "/wide", "int32"});
  EXPECT_EQ(reader.read_i64("/wide"), wide);
  expect_input_error([&] { reader.children("/steps"); }, {path, "/steps"});
  expect_input_error([&] { reader.children("/wide"); }, {path, "/wide"});
}

// Found by fuzz_golden_reader: a float64 dataset whose type message claims 0x61000002-byte elements
// made HDF5's conversion read past the element (SIGBUS); the reader refuses the type instead.
TEST_F(H5FileTest, DamagedNumericTypeIsRefused) {
  const std::string path = file("damaged_type.h5");
  const std::vector<double> values = {0.5, 1.5};
  {
    H5Writer writer(path);
    writer.write_f64("/values", values.data(), {2});
    writer.commit();
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // The datatype message of IEEE float64, little endian: version 1, class float, its bit field, size 8.
  const std::string float64_type("\x11\x20\x3f\x00\x08\x00\x00\x00", 8);
  const size_t at = bytes.find(float64_type);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + 4, 4, std::string("\x02\x00\x00\x61", 4));
  std::ofstream(path, std::ios::binary) << bytes;
  const H5Reader reader(path);
  expect_input_error([&] { reader.read_f64("/values"); }, {path, "/values", "damaged numeric type"});
}

TEST_F(H5FileTest, ExistsAndSortedChildren) {
  const std::string path = file("tree.h5");
  const double value = 1.0;
  {
    H5Writer writer(path);
    for (const char* name :
         {"/steps/2/loss", "/steps/10/loss", "/steps/1/loss", "/batch/tokens",
          "/params/init/output_layer.weight", "/params/init/decoder.final_layernorm.weight",
          "/params/init/embedding.word_embeddings.weight"}) {
      writer.write_f64(name, &value, {});
    }
    writer.commit();
  }
  H5Reader reader(path);
  EXPECT_TRUE(reader.exists("/"));
  EXPECT_TRUE(reader.exists("/steps"));
  EXPECT_TRUE(reader.exists("/steps/10/loss"));
  EXPECT_FALSE(reader.exists("/steps/3"));
  EXPECT_FALSE(reader.exists("/steps/3/loss"));
  EXPECT_FALSE(reader.exists("/batch/tokens/below"));
  EXPECT_EQ(reader.children("/"), (std::vector<std::string>{"batch", "params", "steps"}));
  // Byte order: step numbers need numeric sorting by the caller.
  EXPECT_EQ(reader.children("/steps"), (std::vector<std::string>{"1", "10", "2"}));
  EXPECT_EQ(reader.children("/params/init"),
            (std::vector<std::string>{"decoder.final_layernorm.weight", "embedding.word_embeddings.weight",
                                      "output_layer.weight"}));
  EXPECT_TRUE(reader.children("/steps/1").size() == 1);
}

// Files on which HDF5 1.10 itself overflows a heap buffer (H5Aread of a damaged attribute; the attribute
// message iteration of H5Aexists), found by fuzzing (fuzz/regressions/). The reader must refuse them
// with an InputError or read them; under AddressSanitizer a read that reached the overflow in this
// process aborts the test. With HDF5 1.10 the walk in the child process (h5_walk.h) is what refuses
// them.
TEST(H5FileDamaged, FilesTheHdf5LibraryOverflowsOnAreRefusedNotCrashedOn) {
  const fs::path regressions = fs::path(TOUCHSTONE_SOURCE_DIR) / "fuzz" / "regressions";
  for (const fs::path& file :
       std::vector<fs::path>{regressions / "fuzz_h5_reader" / "attribute_read_overflow",
                             regressions / "fuzz_checkpoint_file" / "attribute_iteration_overflow"}) {
    ASSERT_TRUE(fs::is_regular_file(file)) << file;
    try {
      const H5Reader reader(file.string());
      std::vector<std::string> pending{"/"};
      while (!pending.empty()) {
        const std::string path = pending.back();
        pending.pop_back();
        for (const std::string& name : reader.attribute_names(path)) {
          try {
            (void)reader.string_attribute(path, name);
          } catch (const InputError&) {
          }
        }
        (void)reader.has_attribute(path, "no such attribute");
        if (reader.is_group(path) && pending.size() < 10000) {
          for (const std::string& child : reader.children(path))
            pending.push_back(path == "/" ? "/" + child : path + "/" + child);
        }
      }
    } catch (const InputError& error) {
      // which of the two happens depends on the HDF5 version; neither may crash
      EXPECT_NE(std::string(error.what()).find(file.string()), std::string::npos) << error.what();
    }
  }
}

// HDF5 stops listing the attributes of "/" at a damaged message (a name shorter than its stored length),
// yet still opens "format" by name, and reading it overflows a heap buffer inside H5Aread (found by
// fuzz_h5_reader). The walk cannot read what HDF5 does not list, so a failed listing refuses the file.
TEST(H5FileDamaged, AFileWhoseAttributesCannotBeListedIsRefused) {
  const fs::path file = fs::path(TOUCHSTONE_SOURCE_DIR) / "fuzz" / "regressions" / "fuzz_h5_reader" /
                        "attribute_listing_fails_named_read_overflows";
  ASSERT_TRUE(fs::is_regular_file(file)) << file;
  try {
    const H5Reader reader(file.string());
    FAIL() << "the reader opened a file whose attributes HDF5 cannot list";
  } catch (const InputError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(file.string()), std::string::npos) << message;
    EXPECT_NE(message.find("cannot list the attributes or links"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace touchstone::h5
